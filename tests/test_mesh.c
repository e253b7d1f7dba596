/* ranks: 1 */
/* test_mesh.c: coordinates (tp innermost, row-major), the named degrees, and mesh_check: the
 * degrees left 0 or MESH_REST, the world's product, and each rule's refusal (one line naming the
 * value, the rule and what is valid). The exit-2 behaviour of a bad mesh under mpirun is tested
 * by tests/t_bad_input.sh; the calculator's verdicts against the trainer's by
 * tests/test_plan_calculator.c. Each rule is its technique's (chapters 01-06): the test links
 * chapter 08's sources, which link them all (TESTS_08). */
#include <string.h>
#include "comm.h"
#include "mesh.h"
#include "test_util.h"
#include "../01_transformer_tp/tp.h"
#include "../02_loss_parallel/vocab_parallel.h"
#include "../03_sequence_parallel/sequence_parallel.h"
#include "../04_fsdp/data_parallel.h"
#include "../05_pipeline/pipeline.h"
#include "../06_context_parallel/context_parallel.h"

/* A rule from outside common/ and the chapters: experts dealt out whole over dp_shard (the shape
 * of chapter 09's expert parallelism), to show that mesh_check needs no field for it. */
static const char *experts_over_dp_shard(const mesh_rule *r, const mesh_view *v, char *why, size_t len) {
    if (r->size[0] % v->s.dp_shard == 0) return NULL;
    return mesh_refuse(why, len, "%s does not divide %s %lld: each rank of dp_shard holds whole experts",
                       v->degree[MESH_DP_SHARD], mesh_size_name(v, "--n-experts", "n_experts"), r->size[0]);
}
static mesh_rule experts_rule(int n_experts) {
    return (mesh_rule){.check = experts_over_dp_shard, .size = {n_experts}};
}

/* mesh_check's line for `s` on `world` ranks must contain `says` (NULL: the mesh is valid). */
static void expect(mesh_shape s, int world, const mesh_requirements *r, const char *says) {
    char why[512] = "";
    const char *got = mesh_check(&s, world, r, why, sizeof why);
    if (!says) {
        CHECK(!got, "pp %d dpr %d dps %d cp %d tp %d on %d refused: %s", s.pp, s.dp_replicate, s.dp_shard, s.cp, s.tp,
              world, why);
        return;
    }
    CHECK(got == why && strstr(why, says) && !strchr(why, '\n'), "pp %d dpr %d dps %d cp %d tp %d on %d: \"%s\" (want "
          "a line with \"%s\")", s.pp, s.dp_replicate, s.dp_shard, s.cp, s.tp, world, got ? why : "(accepted)", says);
}

/* Each technique's rules (the chapters' *_rule constructors): the rules asked, in order (the
 * first that refuses speaks), the mesh, the world, and the line (NULL: admitted). */
static void test_technique_rules(void) {
    const llama_config heads4 = {.n_heads = 4}, kv2 = {.n_heads = 4, .n_kv_heads = 2}, ffn129 = {.ffn_dim = 129};
    const llama_config kv2_alone = {.n_kv_heads = 2}, heads6 = {.n_heads = 6, .n_kv_heads = 3};
    const struct { mesh_rule rule[3]; mesh_names names; mesh_shape s; int world; const char *says; } rules[] = {
        {{tp_mesh_rule(&heads4)}, MESH_NAMES_RUN, {.tp = MESH_REST}, 3,
         "NP=3 does not divide --n-heads 4: each tp rank computes whole query heads; use a tp that divides 4"},
        {{tp_mesh_rule(&kv2)}, MESH_NAMES_RUN, {.tp = 4}, 4, "--tp 4 does not divide --n-kv-heads 2"},
        {{tp_mesh_rule(&ffn129)}, MESH_NAMES_RUN, {.tp = 2}, 2,
         "--ffn-dim 129: w1 and w3 are split by rows, w2 by columns; the nearest valid sizes are 128 and 130"},
        {{tp_mesh_rule(&kv2_alone), vocab_mesh_rule(2, 0)}, MESH_NAMES_RUN, {.tp = 4}, 4, "--n-kv-heads"},   /* in order */
        {{vocab_mesh_rule(2, 0), tp_mesh_rule(&kv2_alone)}, MESH_NAMES_RUN, {.tp = 4}, 4, "--n-kv-heads"},   /* 2 pads to 4 */
        /* the vocabulary padded: 250 at tp 4 to 252 (the default multiple, tp), 1,000 at tp 3 to 1,152
         * (128 x 3); a --vocab-multiple tp does not divide is refused */
        {{vocab_mesh_rule(250, 0)}, MESH_NAMES_RUN, {.tp = 4}, 4, NULL},
        {{vocab_mesh_rule(1000, 0)}, MESH_NAMES_RUN, {.tp = 3}, 3, NULL},
        {{vocab_mesh_rule(250, 128)}, MESH_NAMES_RUN, {.tp = 3}, 3,
         "--tp 3 does not divide --vocab 250 padded to a multiple of --vocab-multiple 128 (256 rows): the embedding "
         "and the output layer are split by vocabulary rows; use a --vocab-multiple that is a multiple of 3"},
        {{cp_sequence_rule(30, false)}, MESH_NAMES_RUN, {.tp = 4}, 4, NULL},   /* no sequence parallelism: no rule */
        {{sp_mesh_rule(30)}, MESH_NAMES_RUN, {.tp = 4}, 4,
         "--seq-len 30 cannot be split over --tp 4: sequence parallelism gives each tp rank seq_len / tp tokens of every "
         "sequence; the nearest valid lengths are 28 and 32 (or --no-sp)"},
        {{cp_sequence_rule(36, true), sp_mesh_rule(36)}, MESH_NAMES_RUN, {.cp = 2, .tp = 4}, 8,
         "--seq-len 36 cannot be split over --cp 2 x --tp 4: each cp rank holds seq_len / cp rows and sequence "
         "parallelism splits them over tp; the nearest valid lengths are 32 and 40"},
        {{cp_sequence_rule(62, false)}, MESH_NAMES_RUN, {.cp = 2}, 2,
         "--seq-len 62 cannot be split over --cp 2: each cp rank holds 2 chunks"},
        /* tp 3 is odd: 2 cp and cp x tp together ask for a multiple of 12, whichever rule speaks */
        {{cp_sequence_rule(24, true), sp_mesh_rule(24)}, MESH_NAMES_RUN, {.cp = 2, .tp = 3}, 6, NULL},
        {{cp_sequence_rule(18, true), sp_mesh_rule(18)}, MESH_NAMES_RUN, {.cp = 2, .tp = 3}, 6,
         "the nearest valid lengths are 12 and 24"},
        {{cp_sequence_rule(14, true), sp_mesh_rule(14)}, MESH_NAMES_RUN, {.cp = 2, .tp = 3}, 6,
         "--seq-len 14 cannot be split over --cp 2: each cp rank holds 2 chunks of seq_len / (2 x cp) rows; the "
         "nearest valid lengths are 12 and 24"},
        /* 06's all-to-all: a tp rank's 2 heads and 1 kv head over cp 2 */
        {{cp_heads_rule(&heads6)}, MESH_NAMES_RUN, {.cp = 2, .tp = 3}, 6,
         "--cp-method alltoall deals whole heads out to the --cp 2 ranks, but a tp rank holds 2 heads and 1 kv heads"},
        {{pipeline_layers_rule(6, 0, false)}, MESH_NAMES_RUN, {.pp = MESH_REST}, 4,
         "--n-layers 6 cannot be split evenly into NP=4 x --virtual-stages 1 = 4 chunks: use a multiple of 4 layers"},
        /* the calculator's: 6 + 2 layers in 4 chunks, the ends one fewer; microbatches of 3 sequences */
        {{pipeline_layers_rule(6, 0, true), dp_batch_rule(8), pipeline_microbatches_rule(8, 0, 3)}, MESH_NAMES_PLAN,
         {.pp = 4}, 4, "the global batch of 8 sequences over dp_replicate 1 x dp_shard 1 leaves 8 a data rank: not whole "
                       "microbatches of 3 sequences"},
        {{pipeline_layers_rule(5, 0, true)}, MESH_NAMES_PLAN, {.pp = 4}, 4,
         "5 layers cannot be cut into pp 4 x 1 virtual stages: neither 5 nor 7"},
        {{pipeline_microbatches_rule(8, 3, 0)}, MESH_NAMES_RUN, {.pp = 2}, 2,
         "--batch 8 is not divisible by --microbatches 3: each microbatch takes batch / 3 sequences"},
        {{dp_batch_rule(8), pipeline_microbatches_rule(8, 2, 0)}, MESH_NAMES_RUN, {.pp = 2, .dp_shard = 3}, 6,
         "--batch 8 is not divisible by the data-parallel degree dp_replicate 1 x dp_shard 3 = 3"},
        {{dp_batch_rule(12), pipeline_microbatches_rule(12, 4, 0)}, MESH_NAMES_RUN, {.pp = 2, .dp_shard = 2}, 4,
         "--batch 12 over dp_replicate 1 x dp_shard 2 leaves 6 sequences a data rank, not divisible by --microbatches 4"},
        {{dp_batch_rule(12), pipeline_microbatches_rule(12, 3, 0)}, MESH_NAMES_RUN, {.pp = 2, .dp_shard = 2}, 4, NULL},
        /* a technique mesh.c has never heard of brings its own rule (design.md, "How to add a technique") */
        {{experts_rule(8)}, MESH_NAMES_RUN, {.dp_shard = 4}, 4, NULL},
        {{tp_mesh_rule(&heads4), experts_rule(6)}, MESH_NAMES_RUN, {.dp_shard = 4}, 4,
         "--dp-shard 4 does not divide --n-experts 6: each rank of dp_shard holds whole experts"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        mesh_requirements r = {.names = rules[i].names};
        for (int k = 0; k < 3 && rules[i].rule[k].check; k++) mesh_require(&r, rules[i].rule[k]);
        expect(rules[i].s, rules[i].world, &r, rules[i].says);
    }
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    /* the names and the indices are the same degrees */
    mesh_shape s = {.pp = 2, .dp_shard = 2, .tp = 4};   /* 16 ranks */
    CHECK(s.degree[MESH_PP] == 2 && s.degree[MESH_DP_REPLICATE] == 0 && s.degree[MESH_DP_SHARD] == 2 &&
          s.degree[MESH_CP] == 0 && s.degree[MESH_TP] == 4, "named fields out of mesh.h's order");
    char why[512];
    CHECK(mesh_check(&s, 16, NULL, why, sizeof why) == NULL, "valid mesh rejected: %s", why);
    CHECK(s.dp_replicate == 1 && s.cp == 1, "degrees left 0 are 1, got dp_replicate %d cp %d", s.dp_replicate, s.cp);
    int c[MESH_NDIMS];
    mesh_coords_of(&s, 0, c);
    CHECK(c[0] == 0 && c[2] == 0 && c[4] == 0, "rank 0");
    mesh_coords_of(&s, 5, c);    /* 5 = (0*2 + 1)*4 + 1 */
    CHECK(c[MESH_PP] == 0 && c[MESH_DP_SHARD] == 1 && c[MESH_TP] == 1, "rank 5 -> pp %d dps %d tp %d", c[0], c[2], c[4]);
    mesh_coords_of(&s, 14, c);   /* 14 = (1*2 + 1)*4 + 2 */
    CHECK(c[MESH_PP] == 1 && c[MESH_DP_SHARD] == 1 && c[MESH_TP] == 2, "rank 14");
    for (int r = 0; r < 16; r++) {   /* every rank maps back to itself */
        mesh_coords_of(&s, r, c);
        int back = 0;
        for (int d = 0; d < MESH_NDIMS; d++) back = back * s.degree[d] + c[d];
        CHECK(back == r, "rank %d round trip gives %d", r, back);
    }

    /* the world: the product, the one degree that takes the rest, a degree below 1 */
    expect((mesh_shape){.pp = 2, .dp_shard = 2, .tp = 4}, 8, NULL, "= 16 ranks, but the world has 8");
    expect((mesh_shape){.dp_shard = -2, .tp = 2}, 4, NULL, "dp_shard=-2 is not valid");
    mesh_shape rest = {.pp = 2, .dp_shard = MESH_REST, .tp = 2};
    CHECK(mesh_check(&rest, 12, NULL, why, sizeof why) == NULL && rest.dp_shard == 3, "dp_shard the rest of 12: %d",
          rest.dp_shard);
    expect((mesh_shape){.pp = 3, .dp_shard = MESH_REST}, 8, NULL, "NP=8 is not divisible by --pp 3: dp_shard would not be whole");
    expect((mesh_shape){.pp = MESH_REST, .tp = MESH_REST}, 4, NULL, "tp=-1 is not valid");   /* only one */

    test_technique_rules();
    /* the padding rule itself (mesh.h's examples) */
    const int pad[][4] = {{250, 0, 4, 252}, {1000, 0, 3, 1152}, {128256, 0, 3, 128256}, {128256, 0, 5, 128640},
                          {256, 0, 2, 256}, {256, 0, 4, 256}, {40, 0, 4, 40}, {250, 64, 4, 256}, {250, 0, 1, 256}};
    for (size_t i = 0; i < sizeof pad / sizeof pad[0]; i++)
        CHECK(vocab_padded_size(pad[i][0], pad[i][1], pad[i][2]) == pad[i][3], "vocab %d, multiple %d, tp %d: padded "
              "to %d, expected %d", pad[i][0], pad[i][1], pad[i][2], vocab_padded_size(pad[i][0], pad[i][1], pad[i][2]),
              pad[i][3]);
    int rc = tu_finish("test_mesh");
    comm_finalize();
    return rc;
}
