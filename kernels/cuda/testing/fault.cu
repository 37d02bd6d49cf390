// fault.cu — a kernel that faults on purpose, for tests of device poisoning.
//
//   extern "C" __global__ void fault_trap()
//
// Executes `__trap()`: the launch fails with CUDA_ERROR_LAUNCH_FAILED (an illegal
// instruction trap), a sticky error that poisons the context. Launch with any grid,
// e.g. <<<1, 1>>>. Never use it outside tests.

extern "C" __global__ void fault_trap() { __trap(); }
