/* expert_split_report.c — see expert_split_report.h. */
#include "expert_split_report.h"

#include <stdio.h>
#include <string.h>

#include "codec.h"
#include "config.h"
#include "model.h"
#include "plan.h"
#include "status.h"

int expert_split_sizes(const Config *cfg, ExpertSplitSizes *out)
{
    memset(out, 0, sizeof *out);
    const Codec codec = (Codec)codec_from_name(cfg->outer.codec);
    const CodecParams cp = config_codec_params(&cfg->outer);
    Model m;
    model_describe(&m, &cfg->model, 0, cfg->model.experts);
    ChunkTable ct;
    CHECK(chunk_table_create(&ct, &m, 1));
    for (int c = 0; c < ct.n_chunks; c++) {
        const Chunk *ch = &ct.chunks[c];
        const double v = (double)ch->size, b = (double)codec_encoded_size(codec, ch->size, cp);
        out->all_values += v;
        out->all_bytes += b;
        if (ch->expert < 0) {
            out->dense_values += v;
            out->dense_bytes += b;
        } else if (ch->expert == 0) {
            out->expert_values += v;
            out->expert_bytes += b;
        }
    }
    chunk_table_destroy(&ct);
    return ISTH_OK;
}

double expert_split_refresh_bytes(const Config *cfg, const ExpertSplit *x, const ExpertSplitSizes *z, int s)
{
    return z->expert_bytes * x->count[s] * (x->replicas - 1) / (double)cfg->outer.expert_refresh;
}

/* 1234567 -> "1.23 MB" */
static const char *mb(double bytes, char *buf, size_t size)
{
    snprintf(buf, size, bytes >= 1e9 ? "%.2f GB" : "%.2f MB", bytes >= 1e9 ? bytes / 1e9 : bytes / 1e6);
    return buf;
}

int expert_split_print(const Config *cfg, FILE *out)
{
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[512], a[32], b[32], c[32];
    if (expert_split_assign(cfg, &x, why, sizeof why, &bad)) return isth_fail(ISTH_EINPUT, "%s", why);
    ExpertSplitSizes z;
    CHECK(expert_split_sizes(cfg, &z));
    fprintf(out, "# experts split over %d sites (%s; routing %s; ", x.n_sites,
            x.given ? "site.NAME.experts" : "by each site's share of the tokens per step", cfg->outer.expert_routing);
    if (x.replicas > 1)
        fprintf(out, "each expert held by %d sites: its owner and %d copy(ies), refreshed every %d outer periods)\n",
                x.replicas, x.replicas - 1, cfg->outer.expert_refresh);
    else
        fprintf(out, "no copies: a lost site's experts come back from its checkpoint only)\n");
    for (int s = 0; s < x.n_sites; s++) {
        char range[32];
        snprintf(range, sizeof range, "%d-%d", x.begin[s], x.begin[s] + x.count[s] - 1);
        fprintf(out, "#   %-12s experts %-9s (%d of %d; %.1f%% of the tokens per step)", cfg->sites[s].name, range,
                x.count[s], x.experts, 100.0 * x.share[s]);
        for (int k = 1; k < x.replicas; k++)
            fprintf(out, "%s%s", k == 1 ? "; copies at " : ", ", cfg->sites[expert_split_replica_site(&x, s, k)].name);
        fputc('\n', out);
    }
    double most = 0;
    for (int s = 0; s < x.n_sites; s++) {
        const double sent = z.dense_bytes + expert_split_refresh_bytes(cfg, &x, &z, s);
        if (sent > most) most = sent;
    }
    fprintf(out, "# per outer period (codec %s), a site sends %s (the dense part: %.1f%% of the parameters)", cfg->outer.codec,
            mb(z.dense_bytes, a, sizeof a), 100.0 * z.dense_values / z.all_values);
    if (x.replicas > 1) fprintf(out, " + up to %s refreshing copies (averaged)", mb(most - z.dense_bytes, b, sizeof b));
    fprintf(out, "; replicated experts: %s, %.1fx more\n", mb(z.all_bytes, c, sizeof c), z.all_bytes / most);
    return ISTH_OK;
}
