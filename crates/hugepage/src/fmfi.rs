//! The free-memory fragmentation index (Gorman and Whitcroft's unusable free space
//! index, as Ingens uses it): of the free memory, the fraction that cannot serve a
//! request of order `j` (9 for a 2 MiB page): `(free − Σ_{i≥j} 2^i·k_i) / free`, with
//! `k_i` the free blocks of order `i`, from `/proc/buddyinfo`.

/// One zone's line of `/proc/buddyinfo`: node, zone name, free blocks per order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    pub node: u32,
    pub name: String,
    pub free: Vec<u64>,
}

/// Parse `/proc/buddyinfo` (`Node 0, zone   Normal   1 2 3 …`). Lines that do not
/// parse are skipped.
pub fn parse(text: &str) -> Vec<Zone> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            if w.next()? != "Node" {
                return None;
            }
            let node = w.next()?.trim_end_matches(',').parse().ok()?;
            if w.next()? != "zone" {
                return None;
            }
            let name = w.next()?.to_string();
            let free: Option<Vec<u64>> = w.map(|x| x.parse().ok()).collect();
            Some(Zone {
                node,
                name,
                free: free?,
            })
        })
        .collect()
}

/// The index over `zones` for requests of `order` (0: no free memory at all, or all of
/// it usable).
pub fn index(zones: &[Zone], order: usize) -> f64 {
    let (mut total, mut usable) = (0u128, 0u128);
    for z in zones {
        for (i, &k) in z.free.iter().enumerate() {
            let pages = (k as u128) << i;
            total += pages;
            if i >= order {
                usable += pages;
            }
        }
    }
    if total == 0 {
        return 0.0;
    }
    (total - usable) as f64 / total as f64
}

/// The index for 2 MiB pages on this machine now.
pub fn current() -> std::io::Result<f64> {
    Ok(index(
        &parse(&std::fs::read_to_string("/proc/buddyinfo")?),
        9,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_buddyinfo_and_computes_the_index() {
        let t = "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3 \n\
                 Node 0, zone    DMA32      4      3      2      1      0      0      0      0      0      0      0 \n\
                 garbage line\n";
        let z = parse(t);
        assert_eq!(z.len(), 2);
        assert_eq!(z[1].name, "DMA32");
        assert_eq!(z[0].free[10], 3);
        // DMA: 256 + 512 + 3·1024 pages, all of order ≥ 8; DMA32: 4 + 6 + 8 + 8 = 26
        // pages of low orders.
        let total = 256 + 512 + 3 * 1024 + 26;
        let usable = 512 + 3 * 1024;
        let want = (total - usable) as f64 / total as f64;
        assert!((index(&z, 9) - want).abs() < 1e-12);
        assert_eq!(index(&z, 0), 0.0);
        assert_eq!(index(&[], 9), 0.0);
        // Everything in small blocks: all unusable.
        assert_eq!(index(&z[1..], 9), 1.0);
    }

    #[test]
    fn this_machine_has_an_index() {
        let f = current().expect("/proc/buddyinfo");
        assert!((0.0..=1.0).contains(&f), "{f}");
    }
}
