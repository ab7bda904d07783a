/* testmodel.h — the small model and the parameter randomiser shared by the
 * whole-model tests (test_model.c, test_expert_parallel.c).
 * Owns nothing; must not depend on cmocka (helpers, not checks).
 */
#ifndef ISTHMUS_TESTMODEL_H
#define ISTHMUS_TESTMODEL_H

#include <stdint.h>

#include "model.h"

/* L=2, D=8, 2 heads, 4 experts top-2, F=6, byte vocabulary; capacity 0.75
 * (forces drops) and aux/z weights larger than the defaults so that their
 * gradients matter. */
ModelConfig test_model_config(int context, uint64_t init_seed);

/* Parameters drawn from a canonical-index counter RNG, so a shard of an
 * expert-parallel learner holds exactly the full model's values for its
 * experts. O(1) activations (the N(0,0.02) init would make most terms
 * vanish and hide mistakes): norms' gains 1 + 0.2 N(0,1), the rest
 * 0.5 N(0,1). zero_router: router weights 0 (every probability ties). */
void test_randomize(Model *m, uint64_t seed, int zero_router);

#endif
