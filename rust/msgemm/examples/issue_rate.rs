//! Issue-rate probe: how fast this core runs the int4 lookup loop's instruction mix, with the
//! operands in registers and the index bytes in L1 (no memory stalls, no table build), against
//! variants without the mirror sign fix and against a dense VNNI int4 dot product (the shape
//! of ONNX Runtime's int8-activation path). It bounds what any int4 depth-2 LUT kernel can reach
//! on the machine: `cargo run --release --example issue_rate -p maleki-msgemm`.
//!
//! Each probe runs 1024 weights per iteration: four row blocks of one tuple pair for the LUT
//! (64 rows x 2 tuples x 2 weights), eight 128-weight VNNI steps for the dense one (accumulator
//! chains in both short enough not to bound them: eight for the dense one).
//! Printed: ns per 1024 weights (the minimum of 9 runs) and the implied time of a 4096 x 4096
//! GEMV on one core.

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::asm;
    use std::time::Instant;

    const ITERS: u64 = 5_000_000;

    /// Minimum over 9 runs of `ITERS` calls of `body`, in ns per call.
    fn time(mut body: impl FnMut()) -> f64 {
        (0..9)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..ITERS {
                    body();
                }
                t.elapsed().as_secs_f64() * 1e9 / ITERS as f64
            })
            .fold(f64::MAX, f64::min)
    }

    macro_rules! probe {
        ($p:expr, $body:literal) => {
            time(|| unsafe {
                asm!(
                    $body,
                    p = in(reg) $p,
                    out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                    out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                    out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                    out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                    out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                    out("k1") _, out("k2") _,
                    options(nostack, readonly),
                )
            })
        };
    }

    pub fn run() {
        if !(is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
            && is_x86_feature_detected!("avx512vnni"))
        {
            println!("this probe needs AVX-512 BW, VBMI and VNNI");
            return;
        }
        let buf = vec![0x5au8; 256];
        let p = buf.as_ptr();
        // The kernel's pair step (`pair128_folded`): two index loads, the MSB masks, one
        // `vpermi2b` per tuple, the masked negation, interleave, weighted pair sums, int16 adds.
        let folded = probe!(
            p,
            ".rept 4
            vmovdqu64 zmm0, [{p}]
            vmovdqu64 zmm1, [{p} + 64]
            vpmovb2m k1, zmm0
            vpmovb2m k2, zmm1
            vpermi2b zmm0, zmm2, zmm3
            vpermi2b zmm1, zmm4, zmm5
            vpsubb zmm0 {{k1}}, zmm6, zmm0
            vpsubb zmm1 {{k2}}, zmm6, zmm1
            vpunpcklbw zmm18, zmm0, zmm1
            vpunpckhbw zmm19, zmm0, zmm1
            vpmaddubsw zmm18, zmm7, zmm18
            vpmaddubsw zmm19, zmm7, zmm19
            vpaddw zmm8, zmm8, zmm18
            vpaddw zmm9, zmm9, zmm19
            .endr"
        );
        // The same without the sign fix (what a 128-entry table without mirror would cost:
        // int4 pairs need 256 entries, so this is out of reach for int4).
        let unsigned = probe!(
            p,
            ".rept 4
            vmovdqu64 zmm0, [{p}]
            vmovdqu64 zmm1, [{p} + 64]
            vpermi2b zmm0, zmm2, zmm3
            vpermi2b zmm1, zmm4, zmm5
            vpunpcklbw zmm18, zmm0, zmm1
            vpunpckhbw zmm19, zmm0, zmm1
            vpmaddubsw zmm18, zmm7, zmm18
            vpmaddubsw zmm19, zmm7, zmm19
            vpaddw zmm8, zmm8, zmm18
            vpaddw zmm9, zmm9, zmm19
            .endr"
        );
        // Dense int4 x int8 with VNNI: 64 packed bytes (128 weights), the low and high nibbles
        // masked out (the high ones left at 16x), two `vpdpbusd` against int8 activations;
        // eight accumulators, so that the `vpdpbusd` latency chains do not bound it (Zen 5
        // issues two per cycle with a latency of 4: four chains measured half the rate).
        let vnni = probe!(
            p,
            ".rept 2
            vmovdqu64 zmm0, [{p}]
            vmovdqu64 zmm1, [{p} + 64]
            vpandd zmm16, zmm0, zmm6
            vpandd zmm17, zmm0, zmm7
            vpandd zmm18, zmm1, zmm6
            vpandd zmm19, zmm1, zmm7
            vpdpbusd zmm8, zmm16, zmm2
            vpdpbusd zmm9, zmm17, zmm3
            vpdpbusd zmm10, zmm18, zmm4
            vpdpbusd zmm11, zmm19, zmm5
            vmovdqu64 zmm0, [{p} + 128]
            vmovdqu64 zmm1, [{p} + 192]
            vpandd zmm16, zmm0, zmm6
            vpandd zmm17, zmm0, zmm7
            vpandd zmm18, zmm1, zmm6
            vpandd zmm19, zmm1, zmm7
            vpdpbusd zmm12, zmm16, zmm2
            vpdpbusd zmm13, zmm17, zmm3
            vpdpbusd zmm14, zmm18, zmm4
            vpdpbusd zmm15, zmm19, zmm5
            .endr"
        );
        let gemv = |ns: f64| ns * (4096.0 * 4096.0 / 1024.0) / 1e3;
        println!("ns per 1024 weights (min of 9 runs); 4096 x 4096 GEMV on one core, loop alone");
        for (name, ns) in [
            ("int4 LUT, mirror-folded (the kernel)", folded),
            ("int4 LUT without the sign fix", unsigned),
            ("dense int4 x int8 VNNI", vnni),
        ] {
            println!("{name:40} {ns:7.3} ns  {:7.1} us", gemv(ns));
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    probe::run();
    #[cfg(not(target_arch = "x86_64"))]
    println!("this probe is for x86-64");
}
