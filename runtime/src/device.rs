//! Devices and streams.

use std::fmt;

/// Where a tensor's memory lives.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Device {
    /// Host memory, computed on by the CPU backend: `Cpu(0)`, and with
    /// [`Backend::CpuDevices`](crate::Backend::CpuDevices) the further host devices
    /// `Cpu(1)`, `Cpu(2)`… (each with its own streams, for running multi-device code
    /// without GPUs).
    Cpu(usize),
    /// A CUDA device, by ordinal.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu(0) => f.write_str("cpu"),
            Device::Cpu(i) => write!(f, "cpu:{i}"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// A stream of a runtime, by its index among all the runtime's streams. Get them from
/// the runtime ([`Runtime::compute_streams`](crate::Runtime::compute_streams),
/// [`Runtime::info`](crate::Runtime::info)); [`StreamId::new`] is for placement
/// policies' tests.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct StreamId(pub(crate) usize);

impl StreamId {
    /// The stream at `index` in a runtime's list of streams.
    pub const fn new(index: usize) -> Self {
        StreamId(index)
    }
    /// Its index in the runtime's list of streams.
    pub const fn index(self) -> usize {
        self.0
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// What a stream is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StreamKind {
    /// Runs ops placed by the scheduler.
    Compute,
    /// Host↔device transfers (CUDA backend), so they overlap compute.
    Copy,
    /// The device's collectives ([`Runtime::all_reduce`](crate::Runtime::all_reduce) and
    /// the others), one member of each group per device, in the order the groups were
    /// submitted; never chosen by placement.
    Comm,
}

/// A stream as reported by [`crate::Runtime::info`].
#[derive(Clone, Debug)]
pub struct StreamInfo {
    /// Its id.
    pub id: StreamId,
    /// Its device.
    pub device: Device,
    /// Compute or copy.
    pub kind: StreamKind,
}

/// A device as reported by [`crate::Runtime::info`].
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// Its name (CPU: the thread count).
    pub name: String,
    /// Total memory in bytes, when known.
    pub memory: Option<usize>,
    /// Compute capability, for CUDA devices.
    pub compute_capability: Option<(i32, i32)>,
}
