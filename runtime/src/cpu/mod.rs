//! The CPU backend: one actor thread per stream, computing each op on the host (rayon
//! inside the ops). [`start`] returns its streams to the runtime; the backend keeps no
//! state of its own.

mod actor;

use crate::actor::{spawn_named, StartCx, Started, StreamEntry};
use crate::device::{Device, DeviceInfo, StreamId, StreamInfo, StreamKind};
use crate::mailbox::channel;
use crate::placement::LoadCounters;
use crate::sync::Arc;

/// Starts `cx.streams` CPU stream actors.
pub(crate) fn start(cx: &StartCx) -> Started<()> {
    let n = cx.streams;
    let mut streams = Vec::with_capacity(n);
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let (tx, rx) = channel(cx.mailbox);
        let actor = cx.actor(StreamId(i), Device::Cpu);
        threads.push(spawn_named(format!("rtx-cpu-{i}"), move || {
            actor::cpu_actor(rx, actor)
        }));
        streams.push(StreamEntry {
            info: StreamInfo {
                id: StreamId(i),
                device: Device::Cpu,
                kind: StreamKind::Compute,
            },
            tx,
            load: Arc::new(LoadCounters::default()),
        });
    }
    let devices = vec![DeviceInfo {
        device: Device::Cpu,
        name: format!("{} rayon threads", rayon::current_num_threads()),
        memory: None,
        compute_capability: None,
    }];
    Started {
        devices,
        streams,
        threads,
        state: (),
    }
}
