//! The ptxas report (`--ptxas-options=-v`) parsed into numbers per kernel.
//!
//! ptxas writes, for each entry function:
//!
//! ```text
//! ptxas info    : Compiling entry function 'ew_add_f32' for 'sm_90'
//! ptxas info    : Function properties for ew_add_f32
//!     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 16 registers, used 0 barriers, 380 bytes cmem[0]
//! ```

/// What ptxas reports for one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// The entry point's name (the `extern "C"` name).
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of register spill stores per thread.
    pub spill_stores: u32,
    /// Bytes of register spill loads per thread.
    pub spill_loads: u32,
    /// Bytes of stack frame per thread.
    pub stack_frame: u32,
    /// Bytes of static shared memory per block.
    pub shared: u32,
}

/// Parses ptxas's verbose report from an NVRTC log, one entry per kernel, in order.
/// Lines that are not part of the report are ignored.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    let mut properties_of: Option<String> = None;
    for line in log.lines() {
        let line = line.trim();
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            kernels.push(KernelResources {
                name: name.to_owned(),
                ..Default::default()
            });
        } else if let Some(rest) = after(line, "Function properties for ") {
            properties_of = Some(rest.trim().to_owned());
        } else if line.contains("bytes stack frame") {
            let entry = properties_of
                .as_deref()
                .and_then(|n| kernels.iter_mut().find(|k| k.name == n));
            if let Some(k) = entry {
                k.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used ") && line.contains(" registers") {
            if let Some(k) = kernels.last_mut() {
                k.registers = number_before(line, "registers").unwrap_or(0);
                k.shared = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    kernels
}

fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).map(|i| &line[i + marker.len()..])
}

fn quoted_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    after(line, marker)?.split('\'').next()
}

/// The integer just before `unit` in `line` ("16 registers" → 16).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let head = &line[..line.find(unit)?];
    head.split(|c: char| !c.is_ascii_digit())
        .rfind(|w| !w.is_empty())?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_ptxas_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'a_f32' for 'sm_90'\n\
            ptxas info    : Function properties for a_f32\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 380 bytes cmem[0]\n\
            ptxas info    : Compiling entry function 'b' for 'sm_90'\n\
            ptxas info    : Function properties for b\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 6 registers, used 0 barriers, 352 bytes cmem[0]\n";
        let ks = parse_ptxas_log(log);
        assert_eq!(ks.len(), 2);
        assert_eq!(
            ks[0],
            KernelResources {
                name: "a_f32".into(),
                registers: 40,
                spill_stores: 4,
                spill_loads: 12,
                stack_frame: 8,
                shared: 2048
            }
        );
        assert_eq!(
            (ks[1].name.as_str(), ks[1].registers, ks[1].shared),
            ("b", 6, 0)
        );
    }
}
