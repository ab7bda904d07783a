/* progress.c — see progress.h. */
#include "progress.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

int progress_create(Progress *p, int window, long steps_total, int n_sites, int site, double tokens_per_step)
{
    memset(p, 0, sizeof *p);
    p->window = window < 1 ? 1 : window > PROGRESS_WINDOW_MAX ? PROGRESS_WINDOW_MAX : window;
    p->last_step = -1;
    p->steps_total = steps_total;
    p->n_sites = n_sites;
    p->site = site;
    p->tokens_per_step = tokens_per_step;
    for (int s = 0; s < CONFIG_MAX_SITES; s++) p->sites[s].step = p->recorded[s] = -1;
    p->loss = isth_calloc((size_t)p->window, sizeof(double));
    p->seconds = isth_calloc((size_t)p->window, sizeof(double));
    if (!p->loss || !p->seconds) {
        progress_destroy(p);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the progress window");
    }
    return ISTH_OK;
}

void progress_destroy(Progress *p)
{
    isth_free(p->loss);
    isth_free(p->seconds);
    p->loss = p->seconds = NULL;
    p->n = 0;
}

void progress_step(Progress *p, long step, double loss, double seconds)
{
    if (!p->loss) return;
    p->loss[p->next] = loss;
    p->seconds[p->next] = seconds;
    p->next = (p->next + 1) % p->window;
    if (p->n < p->window) p->n++;
    p->last_step = step;
}

SiteProgress progress_mine(const Progress *p)
{
    SiteProgress s = {.step = -1};
    if (!p->loss || p->n == 0) return s;
    double loss = 0.0, secs = 0.0; /* summed oldest first: the same order on every rank */
    for (int i = 0; i < p->n; i++) {
        const int k = (p->next - p->n + i + p->window) % p->window;
        loss += p->loss[k];
        secs += p->seconds[k];
    }
    s.step = p->last_step;
    s.steps = p->n;
    s.loss = loss / p->n;
    s.ms_per_step = 1e3 * secs / p->n;
    s.tokens_per_s = secs > 0 ? p->tokens_per_step * p->n / secs : 0.0;
    return s;
}

double progress_eta(const Progress *p)
{
    const SiteProgress s = progress_mine(p);
    if (s.step < 0 || s.step >= p->steps_total) return 0.0;
    return (double)(p->steps_total - s.step) * s.ms_per_step / 1e3;
}

/* little-endian on any host */
static void put_u32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void put_f32(unsigned char *b, double v)
{
    const float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_u32(b, u);
}

static double get_f32(const unsigned char *b)
{
    const uint32_t u = get_u32(b);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void encode_one(const SiteProgress *s, unsigned char *b)
{
    memset(b, 0xFF, PROGRESS_BYTES);
    if (s->step < 0 || s->step >= UINT32_MAX || s->steps < 1) return;
    put_u32(b, (uint32_t)s->step);
    put_u32(b + 4, (uint32_t)s->steps);
    put_f32(b + 8, s->loss);
    put_f32(b + 12, s->tokens_per_s);
    put_f32(b + 16, s->ms_per_step);
}

/* 0 for an empty slot, or one that is not a plausible summary of this run */
static int decode_one(const Progress *p, const unsigned char *b, SiteProgress *s)
{
    const uint32_t step = get_u32(b), steps = get_u32(b + 4);
    if (step == UINT32_MAX || step == 0 || (long)step > p->steps_total) return 0;
    if (steps < 1 || steps > PROGRESS_WINDOW_MAX || steps > step) return 0;
    s->step = (long)step;
    s->steps = (int)steps;
    s->loss = get_f32(b + 8); /* a diverging site's is written as null */
    s->tokens_per_s = get_f32(b + 12);
    s->ms_per_step = get_f32(b + 16);
    /* a plausible rate and step time (a step longer than a day is no
     * summary: the ETA made of it would be years) */
    return isfinite(s->tokens_per_s) && s->tokens_per_s >= 0 && s->tokens_per_s <= PROGRESS_MAX_TOKENS_PER_S &&
           isfinite(s->ms_per_step) && s->ms_per_step >= 0 && s->ms_per_step <= PROGRESS_MAX_MS_PER_STEP;
}

void progress_encode(const Progress *p, int n_sites, int only_mine, unsigned char *out)
{
    if (!p) {
        memset(out, 0xFF, (size_t)n_sites * PROGRESS_BYTES);
        return;
    }
    for (int s = 0; s < n_sites; s++) {
        unsigned char *b = out + (size_t)s * PROGRESS_BYTES;
        if (s == p->site) {
            const SiteProgress mine = progress_mine(p);
            encode_one(&mine, b);
        } else if (!only_mine) {
            encode_one(&p->sites[s], b);
        } else {
            memset(b, 0xFF, PROGRESS_BYTES);
        }
    }
}

int progress_learn(Progress *p, const unsigned char *in)
{
    int fresh = 0;
    for (int s = 0; p && s < p->n_sites; s++) {
        SiteProgress got;
        if (s == p->site || !decode_one(p, in + (size_t)s * PROGRESS_BYTES, &got)) continue;
        if (got.step <= p->sites[s].step) continue;
        p->sites[s] = got;
        fresh++;
    }
    return fresh;
}

int progress_news(Progress *p, SiteProgress *out)
{
    for (int s = 0; s < p->n_sites; s++) {
        if (s == p->site || p->sites[s].step <= p->recorded[s]) continue;
        p->recorded[s] = p->sites[s].step;
        *out = p->sites[s];
        return s;
    }
    return -1;
}
