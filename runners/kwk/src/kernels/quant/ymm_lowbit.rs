//! The low-bit (3-, 4-, 5-, 6- and 8-bit code) kernels of the 256-bit tiers, the half of the
//! source in `ymm.rs` (see its doc for the method and the measurements) that the
//! [`ymm_tier!`](super::ymm) macro instantiates through [`ymm_lowbit!`]: the token
//! sub-tiles (`lowbit_tile`), the one-token pass over both halves (`lowbit_gemv`, in
//! pairs of row groups `lowbit_gemv_pair`), and the `avx2` tier's prompts of 8-bit codes
//! on i16 pairs (`code8_matmul_i16`).

/// The low-bit kernels of one 256-bit tier (expanded inside [`ymm_tier!`](super::ymm), which
/// brings the operations and helpers they call into scope).
macro_rules! ymm_lowbit {
    ($features:literal) => {
        /// One token of a low-bit tile with both halves in one pass (see
        /// [`int8_gemv`], also for the `G` groups walked in lock step).
        #[target_feature(enable = $features)]
        unsafe fn lowbit_gemv<const BITS: u32, const G: usize>(
            w: &LowBitTiles,
            x: &Q8Rows,
            smin: &[f32],
            groups: [usize; G],
            tok: usize,
            outs: [&mut [f32; ROW_GROUP]; G],
        ) {
            let nb = w.n_blocks();
            let ncg = w.n_col_groups();
            let bpg = w.group_size / BLOCK;
            let (tile_bytes, high_bytes) = (code_bytes(BITS), high_bytes(BITS));
            // SAFETY: as `lowbit_sub` with N = 1, for each group.
            unsafe {
                let codes = groups.map(|g| w.nibbles.as_ptr().add(g * nb * tile_bytes));
                let hbits = groups.map(|g| {
                    if high_bytes > 0 {
                        w.high_bits.as_ptr().add(g * nb * high_bytes)
                    } else {
                        std::ptr::null()
                    }
                });
                let gs = groups.map(|g| w.group_scales(g));
                let xq = x.quants.as_ptr().add(tok * x.dim);
                let xs = x.scales.as_ptr().add(tok * nb);
                let xbs = x.block_sums.as_ptr().add(tok * nb);
                let mut acc = [[_mm256_setzero_ps(); 2]; G];
                // Each group's super-scales and super-minimums (halves), converted once
                // per super-block.
                let mut sup = [[(_mm256_setzero_ps(), _mm256_setzero_ps()); 2]; G];
                for cg in 0..ncg {
                    if cg % SUPER_GROUPS == 0 {
                        // (No closures here: they would not run with the tier's features.)
                        for (sup_k, &gs_k) in sup.iter_mut().zip(&gs) {
                            let sb = cg / SUPER_GROUPS;
                            *sup_k = [supers_half(gs_k, sb, 0), supers_half(gs_k, sb, 1)];
                        }
                    }
                    // The group's scales `D · sc`, formed once for its blocks.
                    let mut dw = [[_mm256_setzero_ps(); 2]; G];
                    for ((dw_k, &gs_k), sup_k) in dw.iter_mut().zip(&gs).zip(&sup) {
                        *dw_k = [
                            scale_of_half(gs_k, cg, 0, sup_k[0].0),
                            scale_of_half(gs_k, cg, 1, sup_k[1].0),
                        ];
                    }
                    for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                        let da = _mm256_set1_ps(*xs.add(b));
                        for k in 0..G {
                            let tile = codes[k].add(b * tile_bytes);
                            prefetch_ahead(tile, tile_bytes);
                            let hb = hbits[k].wrapping_add(b * high_bytes);
                            if high_bytes > 0 {
                                // The high tiles are a stream of their own.
                                prefetch_ahead(hb, high_bytes);
                            }
                            let s = lowbit_block_both_halves::<BITS>(
                                tile,
                                hb,
                                xq.add(b * BLOCK),
                                *xbs.add(b),
                            );
                            add_scaled(&mut acc[k], s, dw[k], da);
                        }
                    }
                    let sm = _mm256_set1_ps(smin[cg]);
                    for k in 0..G {
                        for h in 0..2 {
                            let mw = min_of_half(gs[k], cg, h, sup[k][h].1);
                            acc[k][h] = _mm256_fmadd_ps(mw, sm, acc[k][h]);
                        }
                    }
                }
                store_groups(acc, outs);
            }
        }

        /// One token of low-bit row groups `ga` and `gb` (GEMV), read as two streams in
        /// lock step, as [`int8_gemv_pair`]; `smin` holds the token's minimum terms.
        ///
        /// # Safety
        /// As [`lowbit_tile`] for both groups with one token (`smin.len() >=
        /// w.n_col_groups()`).
        pub unsafe fn lowbit_gemv_pair(
            w: &LowBitTiles,
            x: &Q8Rows,
            smin: &[f32],
            ga: usize,
            gb: usize,
            tok: usize,
            out: &mut [[f32; ROW_GROUP]; 2],
        ) {
            let [oa, ob] = out;
            // SAFETY: forwarded contract.
            unsafe {
                match w.bits {
                    Bits::B3 => lowbit_gemv::<3, 2>(w, x, smin, [ga, gb], tok, [oa, ob]),
                    Bits::B4 => lowbit_gemv::<4, 2>(w, x, smin, [ga, gb], tok, [oa, ob]),
                    Bits::B5 => lowbit_gemv::<5, 2>(w, x, smin, [ga, gb], tok, [oa, ob]),
                    Bits::B6 => lowbit_gemv::<6, 2>(w, x, smin, [ga, gb], tok, [oa, ob]),
                    Bits::B8 => lowbit_gemv::<8, 2>(w, x, smin, [ga, gb], tok, [oa, ob]),
                }
            }
        }

        /// One low-bit tile (3-, 4-, 5-, 6- or 8-bit codes); `s` holds the tokens' minimum
        /// terms `[t * n_col_groups + cg]` for `t < n`.
        ///
        /// # Safety
        /// As [`int8_tile`], and `s.len() >= n * w.n_col_groups()`.
        pub unsafe fn lowbit_tile(
            w: &LowBitTiles,
            x: &Q8Rows,
            s: &[f32],
            g: usize,
            t0: usize,
            n: usize,
            out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
        ) {
            let ncg = w.n_col_groups();
            let mut t = 0;
            while t < n {
                let m = (n - t).min(SUB_TOKENS);
                let o = &mut out[t..t + m];
                let st = &s[t * ncg..(t + m) * ncg];
                // SAFETY: forwarded contract.
                unsafe {
                    match (w.bits, m) {
                        (Bits::B4, 1) => lowbit_gemv::<4, 1>(w, x, st, [g], t0 + t, [&mut o[0]]),
                        (Bits::B4, 2) => nibble_sub_both::<2>(w, x, st, g, t0 + t, o),
                        (Bits::B4, 3) => nibble_sub_both::<3>(w, x, st, g, t0 + t, o),
                        (Bits::B4, _) => nibble_sub_both::<4>(w, x, st, g, t0 + t, o),
                        (Bits::B3, 1) => lowbit_gemv::<3, 1>(w, x, st, [g], t0 + t, [&mut o[0]]),
                        (Bits::B3, 2) => lowbit_sub::<2, 3>(w, x, st, g, t0 + t, o),
                        (Bits::B3, 3) => lowbit_sub::<3, 3>(w, x, st, g, t0 + t, o),
                        (Bits::B3, _) => lowbit_sub::<4, 3>(w, x, st, g, t0 + t, o),
                        (Bits::B5, 1) => lowbit_gemv::<5, 1>(w, x, st, [g], t0 + t, [&mut o[0]]),
                        (Bits::B5, 2) => lowbit_sub::<2, 5>(w, x, st, g, t0 + t, o),
                        (Bits::B5, 3) => lowbit_sub::<3, 5>(w, x, st, g, t0 + t, o),
                        (Bits::B5, _) => lowbit_sub::<4, 5>(w, x, st, g, t0 + t, o),
                        (Bits::B6, 1) => lowbit_gemv::<6, 1>(w, x, st, [g], t0 + t, [&mut o[0]]),
                        (Bits::B6, 2) => lowbit_sub::<2, 6>(w, x, st, g, t0 + t, o),
                        (Bits::B6, 3) => lowbit_sub::<3, 6>(w, x, st, g, t0 + t, o),
                        (Bits::B6, _) => lowbit_sub::<4, 6>(w, x, st, g, t0 + t, o),
                        (Bits::B8, 1) => lowbit_gemv::<8, 1>(w, x, st, [g], t0 + t, [&mut o[0]]),
                        (Bits::B8, 2) => full8_sub_both::<2>(w, x, st, g, t0 + t, o),
                        (Bits::B8, 3) => full8_sub_both::<3>(w, x, st, g, t0 + t, o),
                        (Bits::B8, _) => full8_sub_both::<4>(w, x, st, g, t0 + t, o),
                    }
                }
                t += m;
            }
        }

        /// `N` tokens of an 8-bit code tile with both 8-row halves in one pass: each
        /// activation quad is broadcast once for 16 rows, where [`lowbit_sub`] walks
        /// the tile once per half. Per (half, token) the same operations in the same
        /// order.
        #[target_feature(enable = $features)]
        unsafe fn full8_sub_both<const N: usize>(
            w: &LowBitTiles,
            x: &Q8Rows,
            smin: &[f32],
            g: usize,
            tok: usize,
            out: &mut [[f32; ROW_GROUP]],
        ) {
            // SAFETY: as `lowbit_sub`.
            unsafe {
                let LowBitGroup {
                    codes,
                    gs,
                    xq,
                    xs,
                    xbs,
                    nb,
                    ncg,
                    bpg,
                    dim,
                    tile_bytes,
                    ..
                } = LowBitGroup::new(w, x, g, tok);
                let mut acc = [[_mm256_setzero_ps(); N]; 2];
                for cg in 0..ncg {
                    let end = ((cg + 1) * bpg).min(nb);
                    for b in cg * bpg..end {
                        let tile = codes.add(b * tile_bytes);
                        if tok == 0 {
                            prefetch_ahead(tile, tile_bytes);
                        }
                        // codes want Σ u·a.
                        let block = Full8Block {
                            xq: xq.add(b * BLOCK),
                            xbs: xbs.add(b),
                            xs: xs.add(b),
                            dim,
                            nb,
                        };
                        let min = (b + 1 == end).then(|| MinStep::new(gs, smin, ncg, cg));
                        full8_block_both::<N>(
                            &mut acc,
                            tile,
                            block,
                            -FULL8_BIAS,
                            RowScales::TwoLevel(gs, cg),
                            min,
                        );
                    }
                }
                store_tokens(&acc, out);
            }
        }

        /// Prompts (more than [`TOKEN_TILE`] tokens) of 8-bit codes with codes and
        /// activations widened to i16 once per call, as `avx512bw::code8_matmul_i16`
        /// does on zmm: per column pair and 8-row half one `vpmaddwd` + `vpaddd` per
        /// token, no sign fix and no per-quad weight preparation. Dispatched on the
        /// `avx2` tier only (with VNNI, `vpdpbusd` takes the bytes as they are).
        ///
        /// # Safety
        /// The module's features; `w` and `x` passed their `check`, `w.bits == 8`, `rows`
        /// within `w.rows` starting at a multiple of 16, `s_all` every token's minimum
        /// terms.
        pub unsafe fn code8_matmul_i16(
            w: &LowBitTiles,
            x: &Q8Rows,
            s_all: &[f32],
            rows: std::ops::Range<usize>,
            y: &crate::kernels::OutputMatrix,
        ) {
            assert_eq!(w.bits, Bits::B8);
            let nb = w.n_blocks();
            let ncg = w.n_col_groups();
            let acts = acts_i16_all(x);
            let mut codes = vec![0i16; nb * I16_BLOCK];
            let mut widened = usize::MAX;
            drive_row_groups(
                rows,
                x.n_tokens,
                y,
                |g, t0, n, out| {
                    if widened != g {
                        let tiles = &w.nibbles[g * nb * INT8_TILE_BYTES..][..nb * INT8_TILE_BYTES];
                        // SAFETY: the module's features (this function's contract).
                        unsafe { widen_codes_i16(tiles, &mut codes) };
                        widened = g;
                    }
                    let mut t = 0;
                    while t < n {
                        let m = (n - t).min(SUB_TOKENS);
                        let o = &mut out[t..t + m];
                        let st = &s_all[(t0 + t) * ncg..(t0 + t + m) * ncg];
                        let wide = WidenedI16 {
                            codes: codes.as_ptr(),
                            acts: acts.as_ptr(),
                        };
                        // SAFETY: forwarded contract; `codes` holds group g widened, `acts`
                        // every token, tokens t0 + t..t0 + t + m are in range.
                        unsafe {
                            match m {
                                1 => code8_i16::<1>(w, wide, x, st, g, t0 + t, o),
                                2 => code8_i16::<2>(w, wide, x, st, g, t0 + t, o),
                                3 => code8_i16::<3>(w, wide, x, st, g, t0 + t, o),
                                _ => code8_i16::<4>(w, wide, x, st, g, t0 + t, o),
                            }
                        }
                        t += m;
                    }
                },
                None,
            );
        }

        /// A row group's 8-bit code tiles (byte `quad * 64 + row * 4 + k`: column
        /// `4 quad + k`) as i16 column pairs: per block, pair `p` (columns `2p`,
        /// `2p + 1`) is two registers, rows 0-7 then 8-15, i32 lane `r` holding the
        /// row's two codes (the lower column in the low half).
        ///
        /// # Safety
        /// The module's features.
        #[target_feature(enable = $features)]
        unsafe fn widen_codes_i16(tiles: &[u8], out: &mut [i16]) {
            let nb = tiles.len() / INT8_TILE_BYTES;
            assert!(out.len() >= nb * I16_BLOCK);
            for b in 0..nb {
                for quad in 0..BLOCK / 4 {
                    for h in 0..2 {
                        let src = &tiles[b * INT8_TILE_BYTES + quad * 64 + h * 32..][..32];
                        // SAFETY: 32 bytes read from a 32-byte slice; each store writes
                        // 16 i16 inside `out` (asserted long enough).
                        unsafe {
                            let v = _mm256_loadu_si256(src.as_ptr() as *const _);
                            // Rows 0-3 and 4-7 of the half, i32 lanes alternating each
                            // row's pairs (2 quad, 2 quad + 1).
                            let lo = _mm256_castsi256_ps(_mm256_cvtepu8_epi16(
                                _mm256_castsi256_si128(v),
                            ));
                            let hi = _mm256_castsi256_ps(_mm256_cvtepu8_epi16(
                                _mm256_extracti128_si256::<1>(v),
                            ));
                            // Per 128-bit lane [r, r + 1, r + 4, r + 5] of one pair;
                            // the 64-bit permute restores row order.
                            let even = _mm256_castps_si256(_mm256_shuffle_ps::<0x88>(lo, hi));
                            let odd = _mm256_castps_si256(_mm256_shuffle_ps::<0xDD>(lo, hi));
                            for (k, v) in [even, odd].into_iter().enumerate() {
                                let at = b * I16_BLOCK + (2 * quad + k) * 32 + h * 16;
                                let rows = _mm256_permute4x64_epi64::<0xD8>(v);
                                _mm256_storeu_si256(out[at..at + 16].as_mut_ptr() as *mut _, rows);
                            }
                        }
                    }
                }
            }
        }

        /// `N` tokens (from `tok`) of row group `g`'s widened 8-bit codes (`codes`,
        /// [`widen_codes_i16`]) with the widened activations `acts` (every token):
        /// exact block dots `Σ u·a`, then [`finish_block`]'s float steps in the
        /// specification's order.
        ///
        /// # Safety
        /// As [`code8_matmul_i16`]; `wide.codes` holds group `g`'s `n_blocks` widened blocks,
        /// `smin` the `N` tokens' minimum terms.
        #[target_feature(enable = $features)]
        unsafe fn code8_i16<const N: usize>(
            w: &LowBitTiles,
            wide: WidenedI16,
            x: &Q8Rows,
            smin: &[f32],
            g: usize,
            tok: usize,
            out: &mut [[f32; ROW_GROUP]],
        ) {
            let WidenedI16 { codes, acts } = wide;
            // SAFETY: the reads stay in the group's widened codes, the `N` tokens'
            // activation rows, and `LowBitGroup`'s slices.
            unsafe {
                let LowBitGroup {
                    gs,
                    xs,
                    nb,
                    ncg,
                    bpg,
                    dim,
                    ..
                } = LowBitGroup::new(w, x, g, tok);
                let a0 = acts.add(tok * dim);
                let mut acc = [[_mm256_setzero_ps(); N]; 2];
                for cg in 0..ncg {
                    let end = ((cg + 1) * bpg).min(nb);
                    for b in cg * bpg..end {
                        let wb = codes.add(b * I16_BLOCK);
                        let mut s = [[_mm256_setzero_si256(); N]; 2];
                        for p in 0..BLOCK / 2 {
                            let w0 = _mm256_loadu_si256(wb.add(p * 32) as *const _);
                            let w1 = _mm256_loadu_si256(wb.add(p * 32 + 16) as *const _);
                            for t in 0..N {
                                let pair = a0.add(t * dim + b * BLOCK + 2 * p) as *const i32;
                                let a = _mm256_set1_epi32(pair.read_unaligned());
                                s[0][t] = _mm256_add_epi32(s[0][t], _mm256_madd_epi16(w0, a));
                                s[1][t] = _mm256_add_epi32(s[1][t], _mm256_madd_epi16(w1, a));
                            }
                        }
                        let min = (b + 1 == end).then(|| MinStep::new(gs, smin, ncg, cg));
                        finish_block(
                            &mut acc,
                            &s,
                            RowScales::TwoLevel(gs, cg),
                            xs.add(b),
                            nb,
                            min,
                        );
                    }
                }
                store_tokens(&acc, out);
            }
        }

        /// `N` tokens of a 4-bit code tile with both 8-row halves per activation
        /// broadcast (as [`full8_sub_both`]); per (half, token) the operations of
        /// [`lowbit_sub`] in its order. The i16 sums of a whole block stay in registers
        /// (8 for 4 tokens), the float accumulators go through memory once per block.
        #[target_feature(enable = $features)]
        unsafe fn nibble_sub_both<const N: usize>(
            w: &LowBitTiles,
            x: &Q8Rows,
            smin: &[f32],
            g: usize,
            tok: usize,
            out: &mut [[f32; ROW_GROUP]],
        ) {
            // SAFETY: as `lowbit_sub`.
            unsafe {
                let LowBitGroup {
                    codes,
                    gs,
                    xq,
                    xs,
                    nb,
                    ncg,
                    bpg,
                    dim,
                    tile_bytes,
                    ..
                } = LowBitGroup::new(w, x, g, tok);
                let mut acc = [[_mm256_setzero_ps(); N]; 2];
                let none = [_mm256_setzero_si256(); 3];
                for cg in 0..ncg {
                    let end = ((cg + 1) * bpg).min(nb);
                    for b in cg * bpg..end {
                        let tile = codes.add(b * tile_bytes);
                        if tok == 0 {
                            prefetch_ahead(tile, tile_bytes);
                        }
                        let mut s16 = [[_mm256_setzero_si256(); N]; 2];
                        let mut quad = 0;
                        let quads = if UNROLL_QUADS {
                            BLOCK / 4
                        } else {
                            std::hint::black_box(BLOCK / 4)
                        };
                        while quad < quads {
                            let c = [0, 1].map(|h| {
                                let v = _mm256_loadu_si256(
                                    tile.add((quad % 4) * 64 + h * 32) as *const _
                                );
                                small_codes::<4>(v, none, quad)
                            });
                            for t in 0..N {
                                let a = _mm256_set1_epi32(
                                    (xq.add(t * dim + b * BLOCK + quad * 4) as *const i32)
                                        .read_unaligned(),
                                );
                                s16[0][t] = small_acc(s16[0][t], c[0], a);
                                s16[1][t] = small_acc(s16[1][t], c[1], a);
                            }
                            quad += 1;
                        }
                        let mut s = [[_mm256_setzero_si256(); N]; 2];
                        for h in 0..2 {
                            for t in 0..N {
                                s[h][t] = small_finish(s16[h][t]);
                            }
                        }
                        let min = (b + 1 == end).then(|| MinStep::new(gs, smin, ncg, cg));
                        finish_block(
                            &mut acc,
                            &s,
                            RowScales::TwoLevel(gs, cg),
                            xs.add(b),
                            nb,
                            min,
                        );
                    }
                }
                store_tokens(&acc, out);
            }
        }

        /// `N` tokens of a 3-, 5- or 6-bit code tile, one 8-row half at a time (4-bit
        /// codes take [`nibble_sub_both`], 8-bit codes [`full8_sub_both`]).
        #[target_feature(enable = $features)]
        unsafe fn lowbit_sub<const N: usize, const BITS: u32>(
            w: &LowBitTiles,
            x: &Q8Rows,
            smin: &[f32],
            g: usize,
            tok: usize,
            out: &mut [[f32; ROW_GROUP]],
        ) {
            let run = small_run(BITS);
            // SAFETY: every pointer stays inside the slices `check` validated: code
            // (and high-bit) tiles of group g, blocks < nb, scales/mins of column
            // groups < ncg, tokens tok..tok+N.
            unsafe {
                let LowBitGroup {
                    codes,
                    hbits,
                    gs,
                    xq,
                    xs,
                    nb,
                    ncg,
                    bpg,
                    dim,
                    tile_bytes,
                    ..
                } = LowBitGroup::new(w, x, g, tok);
                for h in 0..2 {
                    let mut acc = [_mm256_setzero_ps(); N];
                    for cg in 0..ncg {
                        let dw = scale_half(RowScales::TwoLevel(gs, cg), h);
                        for b in cg * bpg..((cg + 1) * bpg).min(nb) {
                            let tile = codes.add(b * tile_bytes + h * 32);
                            if h == 0 && tok == 0 {
                                prefetch_ahead(tile, tile_bytes);
                            }
                            let act = |t: usize, quad: usize| {
                                _mm256_set1_epi32(
                                    (xq.add(t * dim + b * BLOCK + quad * 4) as *const i32)
                                        .read_unaligned(),
                                )
                            };
                            let mut s = [_mm256_setzero_si256(); N];
                            let high = hbits.wrapping_add(b * high_bytes(BITS) + h * 32);
                            let aux = code_aux::<BITS>(tile, high);
                            let mut s16 = [_mm256_setzero_si256(); N];
                            for quad in 0..BLOCK / 4 {
                                let v = nibble_line::<BITS>(tile, quad);
                                let c = small_codes::<BITS>(v, aux, quad);
                                for (t, s16_t) in s16.iter_mut().enumerate() {
                                    *s16_t = small_acc(*s16_t, c, act(t, quad));
                                }
                                if (quad + 1) % run == 0 {
                                    for (s_t, s16_t) in s.iter_mut().zip(s16.iter_mut()) {
                                        *s_t = _mm256_add_epi32(*s_t, small_finish(*s16_t));
                                        *s16_t = _mm256_setzero_si256();
                                    }
                                }
                            }
                            for (t, acc_t) in acc.iter_mut().enumerate() {
                                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*xs.add(t * nb + b)));
                                *acc_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), scale, *acc_t);
                            }
                        }
                        let mw = min_half(gs, cg, h);
                        for (t, acc_t) in acc.iter_mut().enumerate() {
                            *acc_t =
                                _mm256_fmadd_ps(mw, _mm256_set1_ps(smin[t * ncg + cg]), *acc_t);
                        }
                    }
                    for (t, acc_t) in acc.iter().enumerate() {
                        _mm256_storeu_ps(out[t].as_mut_ptr().add(h * 8), *acc_t);
                    }
                }
            }
        }
    };
}
pub(crate) use ymm_lowbit;
