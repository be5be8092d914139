/* The divergence watch: a non-finite loss at once; a loss far above the healthy median in more
 * than half of the window; noise, a falling loss and spikes shorter than half the window are left
 * alone; the median stays the healthy one while the loss is high or oscillates; factor 0 watches
 * only for non-finite losses. */
#include <math.h>

#include "dl-test.h"
#include "trainer.h"

/* A healthy run: the loss falls from 2.3 towards 0.3 with +-20% noise. */
static double healthy(int step)
{
    double base = 0.3 + 2.0 * exp(-step / 200.0);
    return base * (1.0 + 0.2 * sin(step * 1.7));
}

DL_TEST(healthy_noisy_falling_loss_never_diverges)
{
    dl_train_divergence_t d;
    dl_train_divergence_init(&d, 3.0, 20);
    for (int s = 0; s < 5000; s++)
        ck_assert_int_eq(dl_train_divergence_feed(&d, healthy(s)), DL_TRAIN_LOSS_OK);
}

DL_TEST(non_finite_loss_diverges_at_once)
{
    dl_train_divergence_t d;
    dl_train_divergence_init(&d, 3.0, 20);
    ck_assert_int_eq(dl_train_divergence_feed(&d, NAN), DL_TRAIN_LOSS_DIVERGED);
    dl_train_divergence_init(&d, 0.0, 20);
    ck_assert_int_eq(dl_train_divergence_feed(&d, 1.0), DL_TRAIN_LOSS_OK);
    ck_assert_int_eq(dl_train_divergence_feed(&d, INFINITY), DL_TRAIN_LOSS_DIVERGED);
}

DL_TEST(loss_far_above_median_for_the_window_diverges)
{
    dl_train_divergence_t d;
    dl_train_divergence_init(&d, 3.0, 20);
    for (int s = 0; s < 100; s++)
        ck_assert_int_eq(dl_train_divergence_feed(&d, 0.5), DL_TRAIN_LOSS_OK);
    /* Stuck at chance (2.3, 4.6x the median): high for 10 steps, divergence at the 11th, more
     * than half of the window of 20. */
    for (int s = 0; s < 10; s++)
        ck_assert_int_eq(dl_train_divergence_feed(&d, 2.3), DL_TRAIN_LOSS_HIGH);
    ck_assert_double_eq_tol(d.median, 0.5, 1e-12);
    ck_assert_int_eq(dl_train_divergence_feed(&d, 2.3), DL_TRAIN_LOSS_DIVERGED);
}

DL_TEST(spikes_of_half_the_window_are_forgiven)
{
    dl_train_divergence_t d;
    dl_train_divergence_init(&d, 3.0, 20);
    for (int s = 0; s < 100; s++)
        dl_train_divergence_feed(&d, 0.5);
    for (int round = 0; round < 10; round++) {
        for (int s = 0; s < 10; s++)
            ck_assert_int_eq(dl_train_divergence_feed(&d, 50.0), DL_TRAIN_LOSS_HIGH);
        for (int s = 0; s < 10; s++)
            ck_assert_int_eq(dl_train_divergence_feed(&d, 0.6), DL_TRAIN_LOSS_OK);
    }
}

DL_TEST(oscillating_blow_up_diverges)
{
    dl_train_divergence_t d;
    dl_train_divergence_init(&d, 3.0, 20);
    for (int s = 0; s < 100; s++)
        dl_train_divergence_feed(&d, 0.5);
    /* Two high steps, one that dips back: high in 2/3 of the steps, never 20 in a row. */
    dl_train_loss_verdict_t v = DL_TRAIN_LOSS_OK;
    int s;
    for (s = 0; s < 60 && v != DL_TRAIN_LOSS_DIVERGED; s++)
        v = dl_train_divergence_feed(&d, s % 3 == 2 ? 1.0 : 1e6);
    ck_assert_int_eq(v, DL_TRAIN_LOSS_DIVERGED);
    ck_assert_int_lt(s, 20);
    /* After a rollback the window is clear and the healthy median still the old one. */
    dl_train_divergence_forgive(&d);
    ck_assert_int_eq(dl_train_divergence_feed(&d, 2.3), DL_TRAIN_LOSS_HIGH);
    ck_assert_double_eq_tol(d.median, 0.5, 0.2);
}

/* Seen in a straggler test: a model that memorised a small subset sat at a median of 0.026 and
 * had batches at 0.09 (3.5x) in 11 of 20 steps; it started from 2.3 and was not diverging. */
DL_TEST(noise_of_a_memorised_subset_is_no_divergence)
{
    dl_train_divergence_t d;
    dl_train_divergence_init(&d, 3.0, 20);
    for (int s = 0; s < 16; s++)
        ck_assert_int_eq(dl_train_divergence_feed(&d, 2.3), DL_TRAIN_LOSS_OK);
    for (int s = 0; s < 200; s++)
        dl_train_divergence_feed(&d, 0.02);
    for (int s = 0; s < 200; s++)
        ck_assert_int_ne(dl_train_divergence_feed(&d, s % 3 ? 0.09 : 0.02), DL_TRAIN_LOSS_DIVERGED);
    /* Climbing back to where it started is still divergence. */
    dl_train_loss_verdict_t v = DL_TRAIN_LOSS_OK;
    for (int s = 0; s < 20 && v != DL_TRAIN_LOSS_DIVERGED; s++)
        v = dl_train_divergence_feed(&d, 2.0);
    ck_assert_int_eq(v, DL_TRAIN_LOSS_DIVERGED);
}

DL_TEST(no_verdict_before_enough_history)
{
    dl_train_divergence_t d;
    dl_train_divergence_init(&d, 3.0, 2);
    /* The first steps of a run jump around; only non-finite losses count yet. */
    ck_assert_int_eq(dl_train_divergence_feed(&d, 0.1), DL_TRAIN_LOSS_OK);
    for (int s = 0; s < 14; s++)
        ck_assert_int_eq(dl_train_divergence_feed(&d, 100.0), DL_TRAIN_LOSS_OK);
}
