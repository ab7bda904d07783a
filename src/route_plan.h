/* route_plan.h — the expert dispatch plan as arithmetic on the learner's
 * count matrix, shared by every backend: plain C, and __host__ __device__
 * under nvcc so that a kernel can compute any one entry of the plan.
 *
 * cnt (G,E): cnt[s * E + e] = the copies rank s of the learner routes to
 * expert e (each rank's histogram, allgathered). Expert e lives on rank
 * e / El. The capacity rule (cpu/moe.h): an expert keeps the first `cap`
 * copies in (source rank, position) order; cap < 0 keeps all. Every rank
 * derives the same plan from cnt and cap alone, so nothing else about the
 * routing crosses between ranks:
 *  - kept(s, e): rank s's copies for e that the owner keeps — the first
 *    cap − (the copies ranks before s sent to e), at least 0;
 *  - a source sends only its kept copies, in slots grouped by expert (so
 *    by destination rank too), each expert's in copy order; its dropped
 *    copies take the slots after all kept ones, grouped the same way, and
 *    their returned rows are zeros;
 *  - an owner receives from each source, in rank order, that source's kept
 *    copies of its experts by (expert, copy order): arrival (s, el, p);
 *    expert el's compute rows are its kept copies in (source, position)
 *    order, the order the capacity rule uses: row = start(el) + (the kept
 *    copies of ranks before s) + p.
 * The rows an expert computes, and their order, are those of the rule
 * applied to the copies in arrival order at the owner: the same numbers.
 *
 * Split experts (model.h's RoutePolicy): the learner may hold only the
 * experts [off, off + Es) of the router's E. The plan then runs on the
 * count matrix of its Es experts (route_keep_columns) with local indices;
 * a copy routed to an expert it does not hold (ROUTE_DROP) counts as one
 * more group, index Es, after every group of its own experts: such copies
 * are never kept, so they take the last slots, in copy order, behind the
 * capacity's dropped ones, and return zeros as those do.
 *
 * Owns: that arithmetic. Must not: allocate, loop over tokens (the
 * position p of a copy among this rank's copies of its expert is the
 * caller's: a running count on the CPU, a scan on the GPU).
 */
#ifndef ISTHMUS_ROUTE_PLAN_H
#define ISTHMUS_ROUTE_PLAN_H

#ifdef __CUDACC__
#define ROUTE_FN static inline __host__ __device__
#else
#define ROUTE_FN static inline
#endif

/* Copies ranks before s route to e. */
ROUTE_FN int route_prefix(const int *cnt, int E, int s, int e)
{
    int n = 0;
    for (int q = 0; q < s; q++) n += cnt[q * E + e];
    return n;
}

/* Of rank s's copies to e, how many the owner keeps. */
ROUTE_FN int route_kept(const int *cnt, int E, int s, int e, int cap)
{
    const int c = cnt[s * E + e];
    if (cap < 0) return c;
    const int room = cap - route_prefix(cnt, E, s, e);
    return room <= 0 ? 0 : room < c ? room : c;
}

/* Kept copies of rank s to experts [e0, e1). */
ROUTE_FN int route_kept_range(const int *cnt, int E, int s, int e0, int e1, int cap)
{
    int n = 0;
    for (int e = e0; e < e1; e++) n += route_kept(cnt, E, s, e, cap);
    return n;
}

/* Rows rank s sends to rank d (d's El experts). */
ROUTE_FN int route_send_count(const int *cnt, int E, int El, int s, int d, int cap)
{
    return route_kept_range(cnt, E, s, d * El, (d + 1) * El, cap);
}

/* The slot of rank s's copy of expert e at position p (0-based among s's
 * copies of e, in copy order). */
ROUTE_FN int route_copy_slot(const int *cnt, int E, int s, int e, int p, int cap)
{
    const int kept = route_kept(cnt, E, s, e, cap);
    if (p < kept) return route_kept_range(cnt, E, s, 0, e, cap) + p;
    int before = route_kept_range(cnt, E, s, 0, E, cap); /* every kept slot, then the dropped by expert */
    for (int q = 0; q < e; q++) before += cnt[s * E + q] - route_kept(cnt, E, s, q, cap);
    return before + p - kept;
}

/* Rows an expert keeps over the learner. */
ROUTE_FN int route_expert_rows(const int *cnt, int G, int E, int e, int cap)
{
    int total = 0;
    for (int s = 0; s < G; s++) total += cnt[s * E + e];
    return cap >= 0 && total > cap ? cap : total;
}

/* The first compute row of local expert el on owner rank r. */
ROUTE_FN int route_expert_start(const int *cnt, int G, int E, int El, int r, int el, int cap)
{
    int n = 0;
    for (int q = 0; q < el; q++) n += route_expert_rows(cnt, G, E, r * El + q, cap);
    return n;
}

/* Owner r's arrival index of (source s, local expert el, position p). */
ROUTE_FN int route_arrival(const int *cnt, int E, int El, int r, int s, int el, int p, int cap)
{
    int a = 0;
    for (int q = 0; q < s; q++) a += route_send_count(cnt, E, El, q, r, cap);
    return a + route_kept_range(cnt, E, s, r * El, r * El + el, cap) + p;
}

/* Owner r's compute row of (source s, local expert el, position p < kept). */
ROUTE_FN int route_row(const int *cnt, int G, int E, int El, int r, int s, int el, int p, int cap)
{
    const int e = r * El + el, before = route_prefix(cnt, E, s, e);
    return route_expert_start(cnt, G, E, El, r, el, cap) + (cap >= 0 && before > cap ? cap : before) + p;
}

/* Source s's slot bases, every expert at once (the loop moe_send_plan and
 * a GPU's one-thread plan kernel share): kept[e], base[e] (its first kept
 * slot), dbase[e] (its first dropped slot). Returns the kept copies. */
ROUTE_FN int route_source_bases(const int *cnt, int E, int s, int cap, int *kept, int *base, int *dbase)
{
    int n_kept = 0;
    for (int e = 0; e < E; e++) {
        kept[e] = route_kept(cnt, E, s, e, cap);
        base[e] = n_kept;
        n_kept += kept[e];
    }
    for (int e = 0, d = n_kept; e < E; e++) {
        dbase[e] = d;
        d += cnt[s * E + e] - kept[e];
    }
    return n_kept;
}

/* route_copy_slot from the bases. */
ROUTE_FN int route_slot_from_bases(const int *kept, const int *base, const int *dbase, int e, int p)
{
    return p < kept[e] ? base[e] + p : dbase[e] + p - kept[e];
}

/* Split experts: the groups a source's slots come in — the learner's Es
 * experts, and one more for copies to experts it does not hold when the
 * router has any (Es < E). */
ROUTE_FN int route_slot_groups(int Es, int E) { return Es < E ? Es + 1 : Es; }

/* The group of a copy routed to expert c of the router: c - off when the
 * learner holds it, else Es (held elsewhere). */
ROUTE_FN int route_local_expert(int c, int off, int Es)
{
    const int e = c - off;
    return e >= 0 && e < Es ? e : Es;
}

/* cnt (G,E) -> its columns [off, off + Es) as (G,Es), in place: each
 * entry moves to an index no larger, in index order. */
ROUTE_FN void route_keep_columns(int *cnt, int G, int E, int off, int Es)
{
    for (int s = 0; s < G; s++)
        for (int e = 0; e < Es; e++) cnt[s * Es + e] = cnt[s * E + off + e];
}

/* route_source_bases over the W = route_slot_groups groups (cnt (G,Es),
 * the arrays W long): group Es, when there is one, keeps nothing and its
 * slots begin after all of the learner's experts' copies. Returns the
 * kept copies. */
ROUTE_FN int route_source_bases_split(const int *cnt, int Es, int W, int s, int cap, int *kept, int *base, int *dbase)
{
    const int n_kept = route_source_bases(cnt, Es, s, cap, kept, base, dbase);
    if (W > Es) {
        int n = 0;
        for (int e = 0; e < Es; e++) n += cnt[s * Es + e];
        kept[Es] = 0;
        base[Es] = n_kept;
        dbase[Es] = n;
    }
    return n_kept;
}

/* Owner r's expert_start (El+1) and *dropped (copies of its experts beyond
 * capacity). */
ROUTE_FN void route_owner_starts(const int *cnt, int G, int El, int r, int cap, int *expert_start, int *dropped)
{
    const int E = G * El;
    *dropped = 0;
    expert_start[0] = 0;
    for (int el = 0; el < El; el++) {
        const int e = r * El + el, rows = route_expert_rows(cnt, G, E, e, cap);
        int total = 0;
        for (int s = 0; s < G; s++) total += cnt[s * E + e];
        *dropped += total - rows;
        expert_start[el + 1] = expert_start[el] + rows;
    }
}

/* Owner r's counts: recv_counts (G) and route_owner_starts'. Returns the
 * arrivals (= its rows). */
ROUTE_FN int route_owner_counts(const int *cnt, int G, int El, int r, int cap, int *recv_counts, int *expert_start,
                                int *dropped)
{
    int n = 0;
    for (int s = 0; s < G; s++) n += recv_counts[s] = route_send_count(cnt, G * El, El, s, r, cap);
    route_owner_starts(cnt, G, El, r, cap, expert_start, dropped);
    return n;
}

/* Owner r's compute row of arrival a (< the arrivals), from its counts. */
ROUTE_FN int route_arrival_row(const int *cnt, int G, int El, int r, int cap, const int *recv_counts,
                               const int *expert_start, int a)
{
    const int E = G * El;
    int s = 0;
    while (s < G - 1 && a >= recv_counts[s]) a -= recv_counts[s++]; /* the source's block */
    int el = 0, n = route_kept(cnt, E, s, r * El, cap);
    while (el < El - 1 && a >= n) { /* the expert within it */
        a -= n;
        n = route_kept(cnt, E, s, r * El + ++el, cap);
    }
    const int before = route_prefix(cnt, E, s, r * El + el);
    return expert_start[el] + (cap >= 0 && before > cap ? cap : before) + a;
}

#endif
