//! A hand-rolled client that speaks the protocol and writes its log ring directly: for
//! tests that play a malicious or stuck client.

use cairn_format::log::{self, Record};
use cairn_proto::{Request, Response};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A registered client without LibFS: its socket, registration, ring and a read-only
/// view of the shared area. Panics on failure (test code).
pub struct RawClient {
    pub sock: UnixStream,
    pub reg: cairn_proto::Registration,
    /// The slot's client page (4 KiB) and ring.
    pub log: cairn_media::Mapping,
    pub area: cairn_area::Area,
    /// The descriptors the daemon sent: the NVM file (read-only) and the slot's log file.
    pub nvm: std::fs::File,
    pub log_file: std::fs::File,
    _lock: std::fs::File,
}

impl RawClient {
    /// Register with the daemon of `store` (which must be running), take the slot lock
    /// and map the log from the descriptors the daemon sends.
    pub fn connect(store: &Path) -> RawClient {
        let dir = cairn_area::StoreDir::new(store);
        let mut sock = UnixStream::connect(dir.socket_path()).expect("connect to the daemon");
        cairn_proto::send(
            &mut sock,
            &Request::Register {
                pid: std::process::id(),
            },
        )
        .unwrap();
        let reg = match cairn_proto::recv(&mut sock).unwrap() {
            Response::Registered(reg) => reg,
            r => panic!("register refused: {r:?}"),
        };
        assert!(
            reg.log_fds,
            "a store of this format sends the log's descriptors"
        );
        let mut fds = cairn_proto::recv_fds(&sock, cairn_proto::REGISTRATION_FDS)
            .unwrap()
            .into_iter();
        let nvm = std::fs::File::from(fds.next().unwrap());
        let log_file = std::fs::File::from(fds.next().unwrap());
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.slot_lock_path(reg.slot))
            .unwrap();
        cairn_media::sys::flock_exclusive(&lock, false).unwrap();
        let area = cairn_area::Area::open(&nvm, false).unwrap();
        let l = *area.layout();
        let log =
            cairn_media::Mapping::new(&log_file, 0, l.slot_file_bytes() as usize, true, false)
                .unwrap();
        RawClient {
            sock,
            reg,
            log,
            area,
            nvm,
            log_file,
            _lock: lock,
        }
    }

    /// Write raw transaction bytes at the head and ask for a digest of them.
    pub fn log_bytes_and_digest(&mut self, bytes: &[u8]) -> Response {
        let l = self.area.layout();
        let off = (l.ring_off(self.reg.slot) + self.reg.head_lsn % l.ring_bytes()) as usize;
        self.log.write(off, bytes).unwrap();
        self.log.persist(off, bytes.len()).unwrap();
        let upto = self.reg.head_lsn + bytes.len() as u64;
        cairn_proto::send(
            &mut self.sock,
            &Request::Digest {
                upto_lsn: upto,
                wait: true,
            },
        )
        .unwrap();
        cairn_proto::recv(&mut self.sock).unwrap_or(Response::Error {
            errno: -1,
            message: "connection closed".into(),
        })
    }

    /// Log one transaction of `recs` at the head and ask for a digest of it.
    pub fn log_and_digest(&mut self, recs: &[Record<'_>]) -> Response {
        let bytes = log::build_txn(self.reg.head_seq, recs);
        self.log_bytes_and_digest(&bytes)
    }

    /// Publish `epoch` as this client's reader epoch (as a reader in the middle of a
    /// read would).
    pub fn pin_epoch(&self, epoch: u64) {
        self.log
            .store_u64(
                cairn_format::slot::client_page::READER_EPOCH as usize,
                epoch,
            )
            .unwrap();
    }
}
