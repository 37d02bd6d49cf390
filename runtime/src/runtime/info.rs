//! What a runtime reports about itself ([`Runtime::info`](super::Runtime::info)).

use super::BackendKind;
use crate::device::{DeviceInfo, StreamInfo, StreamKind};

/// What a runtime runs on.
#[derive(Clone, Debug)]
pub struct RuntimeInfo {
    /// The backend.
    pub backend: BackendKind,
    /// Its devices.
    pub devices: Vec<DeviceInfo>,
    /// Its streams.
    pub streams: Vec<StreamInfo>,
    /// The placement policy's name.
    pub policy: &'static str,
}

impl std::fmt::Display for RuntimeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "backend: {:?}, policy: {}", self.backend, self.policy)?;
        for d in &self.devices {
            write!(f, "  {}: {}", d.device, d.name)?;
            if let Some(m) = d.memory {
                write!(f, ", {:.1} GiB", m as f64 / (1u64 << 30) as f64)?;
            }
            if let Some((a, b)) = d.compute_capability {
                write!(f, ", sm_{a}{b}")?;
            }
            let n = self
                .streams
                .iter()
                .filter(|s| s.device == d.device && s.kind == StreamKind::Compute)
                .count();
            let c = self
                .streams
                .iter()
                .filter(|s| s.device == d.device && s.kind == StreamKind::Copy)
                .count();
            let k = self
                .streams
                .iter()
                .filter(|s| s.device == d.device && s.kind == StreamKind::Comm)
                .count();
            write!(f, ", {n} compute streams, {c} copy streams")?;
            if k > 0 {
                write!(
                    f,
                    ", {k} communication stream{}",
                    if k == 1 { "" } else { "s" }
                )?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
