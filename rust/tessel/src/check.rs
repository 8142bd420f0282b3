//! A minimal validity check (V1-V4 and the memory caps of spec §1) used by the search to
//! guard its own outputs and by the tests. It stops at the first violation; the public
//! validator that lists every violation lives elsewhere.

use crate::model::{memory_levels, MemoryConvention, Premise, UNLIMITED};

/// `Ok(())` when `starts` (row-major `nmicros x nblocks`) satisfies V1 (precedence with lags),
/// V2 (device exclusivity), V3 (memory within `memory`), V4 (FIFO per block, when `fifo`)
/// and `starts >= 0`; otherwise a message naming the first violation.
pub(crate) fn check(
    p: &Premise,
    nmicros: usize,
    starts: &[i64],
    memory: &[i64],
    conv: MemoryConvention,
    fifo: bool,
) -> Result<(), String> {
    let n = p.nblocks();
    if starts.len() != n * nmicros {
        return Err(format!(
            "expected {} starts, got {}",
            n * nmicros,
            starts.len()
        ));
    }
    if memory.len() < p.ndevs() {
        return Err(format!(
            "expected {} memory caps, got {}",
            p.ndevs(),
            memory.len()
        ));
    }
    let s = |j: usize, g: usize| starts[j * n + g];
    for j in 0..nmicros {
        for g in 0..n {
            if s(j, g) < 0 {
                return Err(format!("job ({g}, {j}) starts at {} < 0", s(j, g)));
            }
            for &(h, lag) in p.succs(g) {
                if s(j, h) < s(j, g) + p.span(g) + lag {
                    return Err(format!("V1: job ({h}, {j}) starts before ({g}, {j}) ends"));
                }
            }
            if fifo && j > 0 && s(j, g) <= s(j - 1, g) {
                return Err(format!(
                    "V4: job ({g}, {j}) does not start after ({g}, {})",
                    j - 1
                ));
            }
        }
    }
    for (d, &cap) in memory.iter().enumerate().take(p.ndevs()) {
        let mut iv: Vec<(i64, i64, i64)> = Vec::new();
        for &g in p.blocks_on(d) {
            for j in 0..nmicros {
                iv.push((s(j, g), s(j, g) + p.span(g), p.block(g).memory));
            }
        }
        iv.sort_unstable();
        for w in iv.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(format!(
                    "V2: two jobs overlap on device {d} at time {}",
                    w[1].0
                ));
            }
        }
        if cap == UNLIMITED {
            continue;
        }
        let mut ev: Vec<(i64, i64)> = iv
            .iter()
            .filter(|x| x.2 != 0)
            .map(|&(a, b, mu)| (conv.effect_time(a, b - a, mu), mu))
            .collect();
        ev.sort_unstable();
        for (t, level) in memory_levels(&ev) {
            if level > cap {
                return Err(format!(
                    "V3: memory {level} on device {d} at time {t} exceeds the cap {cap}"
                ));
            }
        }
    }
    Ok(())
}
