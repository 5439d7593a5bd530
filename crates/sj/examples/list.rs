//! SpaceJMP on Cairn from Rust: one process builds a linked list in a segment, another
//! (later, after a restart too) walks it. Nodes hold addresses (`SegPtr`), valid in
//! every process because the segment is always at the same address.
//!
//! ```text
//! cargo run --release -p cairn-sj --example list -- build 1000
//! cargo run --release -p cairn-sj --example list -- read      # sum 500500 n 1000
//! ```

use cairn_sj::{flags, prot, CommitMode, SegPtr, SpaceJmp, Target};

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Node {
    value: u64,
    next: SegPtr,
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let sj = SpaceJmp::open(None)?;
    match args.get(1).map(String::as_str) {
        Some("build") => {
            let n: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
            let seg = sj.seg_alloc("rlist", None, 8 << 20, prot::RW, flags::LOCKABLE, 0o640)?;
            let vid = sj.vas_create("rlists", 0o640)?;
            sj.seg_attach(Target::Vas(vid), seg, prot::RW)?;
            let vh = sj.vas_attach(vid, CommitMode::Snapshot)?;
            let g = sj.enter(vh)?; // this thread is in "rlists" until `g` is dropped
            let mut head = SegPtr::NULL;
            for value in 1..=n {
                head = g.alloc(seg, Node { value, next: head })?;
            }
            g.set_root(seg, "head", head)?;
            g.commit()?; // durable, all or nothing
            println!("built {n} nodes at {:#x}", head.0);
        }
        Some("read") => {
            let vh = sj.vas_attach(sj.vas_find("rlists")?, CommitMode::Snapshot)?;
            let seg = sj.seg_find("rlist")?;
            let g = sj.enter(vh)?;
            let (mut sum, mut n) = (0, 0);
            let mut p = g.root(seg, "head")?.unwrap_or(SegPtr::NULL);
            while !p.is_null() {
                let node: Node = g.get(p)?;
                sum += node.value;
                n += 1;
                p = node.next;
            }
            println!("sum {sum} n {n}");
        }
        _ => {
            eprintln!("usage: list build N | list read");
            std::process::exit(2);
        }
    }
    Ok(())
}
