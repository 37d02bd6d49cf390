//! The CPU backend: one actor thread per stream, computing each op on the host (rayon
//! inside the ops). [`start`] returns its streams to the runtime; the backend keeps no
//! state of its own.

mod actor;

use crate::actor::{spawn_named, StartCx, Started, StreamEntry};
use crate::device::{Device, DeviceInfo, StreamId, StreamInfo, StreamKind};
use crate::mailbox::channel;
use crate::placement::LoadCounters;
use crate::sync::Arc;

/// Starts `cx.streams` CPU stream actors on each of `devices` host devices (`Cpu(0)`,
/// `Cpu(1)`…), numbered device by device; with `comm`, each device also gets a
/// communication stream (its collectives), after its compute streams.
pub(crate) fn start(cx: &StartCx, devices: usize, comm: bool) -> Started<()> {
    let per = cx.streams + usize::from(comm);
    let mut streams = Vec::with_capacity(devices * per);
    let mut threads = Vec::with_capacity(devices * per);
    for d in 0..devices {
        let device = Device::Cpu(d);
        for j in 0..per {
            let i = streams.len();
            let kind = if j < cx.streams {
                StreamKind::Compute
            } else {
                StreamKind::Comm
            };
            let (tx, rx) = channel(cx.mailbox);
            let actor = cx.actor(StreamId(i), device);
            let name = match (d, kind) {
                (0, StreamKind::Compute) => format!("rtx-cpu-{i}"),
                (_, StreamKind::Compute) => format!("rtx-cpu{d}-{i}"),
                _ => format!("rtx-cpu{d}-comm"),
            };
            threads.push(spawn_named(name, move || actor::cpu_actor(rx, actor)));
            streams.push(StreamEntry {
                info: StreamInfo {
                    id: StreamId(i),
                    device,
                    kind,
                },
                tx,
                load: Arc::new(LoadCounters::default()),
            });
        }
    }
    let name = format!("{} rayon threads", rayon::current_num_threads());
    let devices = (0..devices)
        .map(|d| DeviceInfo {
            device: Device::Cpu(d),
            name: if devices > 1 {
                format!("host device {d} of {devices}, {name} shared")
            } else {
                name.clone()
            },
            memory: None,
            compute_capability: None,
        })
        .collect();
    Started {
        devices,
        streams,
        threads,
        state: (),
    }
}
