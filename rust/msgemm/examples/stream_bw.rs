//! Read-bandwidth probe: how fast one and two cores of this machine stream a buffer the size
//! of a GEMV's weights, with nothing else to do (512-bit loads summed into 8 accumulators). No
//! GEMV that reads its weights once per call can beat `bytes / bandwidth`, so this bounds the
//! int4 4096 x 4096 GEMV (8.5 MiB of codes and scales) and numpy's float32 one (64 MiB) on the
//! same machine, and with them the ratio between the two:
//! `cargo run --release --example stream_bw -p maleki-msgemm`.
//!
//! Each thread reads its own contiguous part of the buffer; the threads start together (a
//! barrier per repeat) and each keeps its fastest repeat; the printed rate is the buffer over
//! the slowest thread's fastest time.

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::sync::Barrier;
    use std::time::Instant;

    /// Sum of the buffer as 64-bit lanes (kept so that the loads are not removed).
    #[target_feature(enable = "avx512f")]
    unsafe fn read_all(buf: &[u8]) -> i64 {
        use std::arch::x86_64::*;
        // SAFETY: every load reads 64 bytes inside `buf` (the loop stops 512 bytes before its end).
        unsafe {
            let mut acc = [_mm512_setzero_si512(); 8];
            let p = buf.as_ptr();
            let mut i = 0;
            while i + 512 <= buf.len() {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_add_epi64(*a, _mm512_loadu_si512(p.add(i + 64 * j) as *const _));
                }
                i += 512;
            }
            let s = acc
                .iter()
                .fold(_mm512_setzero_si512(), |s, a| _mm512_add_epi64(s, *a));
            _mm512_reduce_add_epi64(s)
        }
    }

    /// GB/s at which `threads` threads read `bytes` (split evenly), fastest of `reps`.
    fn bandwidth(bytes: usize, threads: usize, reps: usize) -> f64 {
        let buf: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
        let part = bytes / threads;
        let barrier = Barrier::new(threads);
        let slowest = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (mine, barrier) = (&buf[t * part..(t + 1) * part], &barrier);
                    s.spawn(move || {
                        let mut best = f64::MAX;
                        for _ in 0..reps {
                            barrier.wait();
                            let start = Instant::now();
                            // SAFETY: AVX-512F is checked in `main`.
                            std::hint::black_box(unsafe { read_all(mine) });
                            best = best.min(start.elapsed().as_secs_f64());
                        }
                        best
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reader thread"))
                .fold(0.0, f64::max)
        });
        bytes as f64 / slowest / 1e9
    }

    pub fn run() {
        if !std::is_x86_feature_detected!("avx512f") {
            println!("this probe needs AVX-512F");
            return;
        }
        let int4 = 4096 * 4096 / 2 + 4096 * 32 * 4; // codes + float32 scales of g128
        let f32s = 4096 * 4096 * 4;
        println!("read bandwidth (GB/s, fastest of the repeats, slowest thread)");
        println!("{:>10} {:>10} {:>10}", "MiB", "1 thread", "2 threads");
        let mut at = Vec::new();
        for mib in [1usize, 2, 4, 8, 16, 64] {
            let bytes = mib << 20;
            let reps = (2_000 / mib).max(50);
            let (b1, b2) = (bandwidth(bytes, 1, reps), bandwidth(bytes, 2, reps));
            println!("{mib:>10} {b1:>10.1} {b2:>10.1}");
            at.push((mib, b2));
        }
        let bw = |mib: usize| at.iter().find(|(m, _)| *m == mib).map_or(f64::NAN, |x| x.1);
        let (t_int4, t_f32) = (int4 as f64 / bw(8) / 1e6, f32s as f64 / bw(64) / 1e6);
        println!(
            "2 threads: int4 g128 4096 x 4096 GEMV >= {t_int4:.3} ms ({:.1} MiB at the 8 MiB rate), \
             numpy float32 >= {t_f32:.3} ms (64 MiB at the 64 MiB rate): at most {:.1}x numpy \
             when both run at these rates",
            int4 as f64 / (1 << 20) as f64,
            t_f32 / t_int4
        );
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    probe::run();
    #[cfg(not(target_arch = "x86_64"))]
    println!("this probe is for x86-64");
}
