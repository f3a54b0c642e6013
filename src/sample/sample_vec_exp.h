/*
 * sample_vec_exp.h -- the constants of the sampler's exponential (sample_vec.c describes the
 * algorithm), shared by the scalar and the vector code so that both evaluate the same
 * sequence of float operations. Internal to src/sample.
 */
#ifndef DI_SAMPLE_VEC_EXP_H
#define DI_SAMPLE_VEC_EXP_H

#define EXP_LOG2E  1.44269504088896341f
#define EXP_MAGIC  12582912.0f     /* 1.5 * 2^23: adding it rounds to an integer */
#define EXP_LN2_HI 0.693359375f    /* ln 2 to 9 bits (355 / 512) */
#define EXP_LN2_LO -2.12194440e-4f /* ln 2 - EXP_LN2_HI */

/* e^r ~ 1 + r + r^2 (P5 + r (P4 + r (P3 + r (P2 + r (P1 + r P0))))), |r| <= ln2 / 2 (Cephes). */
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

#endif /* DI_SAMPLE_VEC_EXP_H */
