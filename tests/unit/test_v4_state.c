/*
 * test_v4_state.c -- DeepSeek-V4's storage (src/kv/v4_state.c): the paged entry pool's
 * addressing through a block table, computed here independently from the layout rule
 * (block b holds the entries of the windows starting in positions b * block_size ..), the
 * block_size check naming the argument, disjoint rows for every (layer, block, entry), and
 * the slots' position-addressed compressor rows (two alternating windows) and ring layout.
 */
#include "kv/v4_state.h"
#include "test.h"

#include <string.h>

enum { SLIDING = 0, CSA = 1, HCA = 2 };

static const uint8_t g_kinds[4] = {SLIDING, CSA, HCA, CSA};
static const int64_t g_rates[4] = {0, 4, 16, 4};

TEST(pool_block_size_must_divide) {
    di_v4_pool p;
    CHECK_EQ_INT(di_v4_pool_init(&p, NULL, 4, g_kinds, g_rates, 8, 4, 3, 24), DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "block_size 24") != NULL);
    CHECK(p.mem == NULL);
    CHECK_EQ_INT(di_v4_pool_init(&p, NULL, 4, g_kinds, g_rates, 8, 4, 0, 16), DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "n_blocks") != NULL);
}

TEST(pool_addressing) {
    const int64_t d = 8, dI = 4, nb = 5, bs = 32;
    di_v4_pool p;
    CHECK_EQ_INT(di_v4_pool_init(&p, NULL, 4, g_kinds, g_rates, d, dI, nb, bs), DI_OK);
    CHECK(p.layers[0].entries == NULL && p.layers[2].ientries == NULL);
    const int32_t table[3] = {4, 0, 2}; /* positions 0..95 */
    for (int64_t il = 1; il < 4; il++) {
        const int64_t m = g_rates[il], per = bs / m;
        CHECK_EQ_INT(p.layers[il].per_block, per);
        for (int64_t w = 0; w < 96 / m; w++) {
            /* The window's first position lies in block w m / bs, row (w m mod bs) / m. */
            int64_t blk = table[(w * m) / bs], row = blk * per + (w * m % bs) / m;
            CHECK(di_v4_pool_entry(&p, il, table, w) == p.layers[il].entries + row * d);
            if (g_kinds[il] == CSA)
                CHECK(di_v4_pool_ientry(&p, il, table, w) == p.layers[il].ientries + row * dI);
        }
    }
    /* Every (layer, block, row) is its own memory: write a tag to each, read all back. */
    for (int64_t il = 1; il < 4; il++)
        for (int64_t r = 0; r < nb * p.layers[il].per_block; r++) {
            for (int64_t i = 0; i < d; i++)
                p.layers[il].entries[r * d + i] = (float)(il * 1000 + r);
            if (p.layers[il].ientries)
                for (int64_t i = 0; i < dI; i++)
                    p.layers[il].ientries[r * dI + i] = (float)(-il * 1000 - r);
        }
    bool ok = true;
    for (int64_t il = 1; il < 4; il++)
        for (int64_t r = 0; r < nb * p.layers[il].per_block; r++) {
            for (int64_t i = 0; i < d; i++)
                ok &= p.layers[il].entries[r * d + i] == (float)(il * 1000 + r);
            if (p.layers[il].ientries)
                for (int64_t i = 0; i < dI; i++)
                    ok &= p.layers[il].ientries[r * dI + i] == (float)(-il * 1000 - r);
        }
    CHECK_MSG(ok, "pool rows overlap");
    di_v4_pool_free(&p);
}

TEST(slots_layout) {
    const int64_t W = 6, d = 8, dI = 4;
    di_v4_slots s;
    CHECK_EQ_INT(di_v4_slots_init(&s, NULL, 3, 4, g_kinds, g_rates, W, d, dI), DI_OK);
    CHECK_EQ_INT(s.n_slots, 3);
    for (int64_t k = 0; k < 3; k++) {
        const di_v4_slot_layer *L = s.slot[k].layers;
        CHECK(L[0].comp.c == NULL && L[2].icomp.c == NULL);
        CHECK(L[1].comp.overlap && L[1].comp.cw == 2 * d && L[1].icomp.cw == 2 * dI);
        CHECK(!L[2].comp.overlap && L[2].comp.cw == d && L[2].comp.m == 16);
        /* Window w's rows are half w mod 2: positions m apart alternate, 2 m apart coincide. */
        const di_v4_comp_state *cs = &L[1].comp;
        for (int64_t p = 0; p < 40; p++) {
            CHECK(di_v4_comp_c(cs, p) == cs->c + (((p / 4) % 2) * 4 + p % 4) * cs->cw);
            CHECK(di_v4_comp_z(cs, p) == di_v4_comp_z(cs, p + 8));
            CHECK(di_v4_comp_c(cs, p) != di_v4_comp_c(cs, p + 4));
        }
    }
    /* Slots do not share memory: fill slot 0's rings, slot 1's stay zero. */
    for (int64_t il = 0; il < 4; il++)
        for (int64_t i = 0; i < W * d; i++)
            s.slot[0].layers[il].ring[i] = 1.0f;
    bool zero = true;
    for (int64_t il = 0; il < 4; il++)
        for (int64_t i = 0; i < W * d; i++)
            zero &= s.slot[1].layers[il].ring[i] == 0.0f;
    CHECK(zero);
    di_v4_slot_reset(&s.slot[2], 123);
    CHECK_EQ_INT(s.slot[2].base, 123);
    di_v4_slots_free(&s);
    CHECK(s.mem == NULL);
}

int main(void) {
    RUN(pool_block_size_must_divide);
    RUN(pool_addressing);
    RUN(slots_layout);
    return test_summary();
}
