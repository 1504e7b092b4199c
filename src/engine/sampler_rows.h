/* sampler_rows.h — internal bridge from a kiln_sampler to the backend's `sample` op: fills one
 * kiln_sample_row with the sampler's parameters and its next uniform draw. */
#ifndef KILN_ENGINE_SAMPLER_ROWS_H
#define KILN_ENGINE_SAMPLER_ROWS_H

#include "backend/backend.h"
#include "kiln.h"

/* Fills *row for sampling logits row `logits_row` with history[0..n_hist) and draws u as
 * kiln_sampler_sample would (the generator advances). Returns the first history index of the
 * penalty window; row->n_history is the window's length (0 when the penalties are off) and
 * row->history_offset is left 0 for the caller to set. */
int kiln_sampler_fill_row(kiln_sampler *s, int n_hist, int64_t logits_row, kiln_sample_row *row);

#endif
