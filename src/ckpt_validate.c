/* ckpt_validate.c — see ckpt_validate.h. */
#include "ckpt_validate.h"

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "fletcher.h"
#include "h5io.h"
#include "status.h"

static int counters_valid(hid_t file, char *reason, size_t cap);

/* ---- validation ----------------------------------------------------------- */

typedef struct {
    char *reason;
    size_t cap;
    int datasets;
} VisitCtx;

/* The largest block validation reads at once (elements): a chunk of a
 * chunked dataset, else rows of a contiguous one up to this many. */
#define VALIDATE_BLOCK ((hsize_t)1 << 24)

/* Read dataset d block by block (its chunks, so every fletcher32 checksum
 * is verified), never more than one block in memory; 0 when every value
 * was read and is finite, else 1 with the reason. */
static int read_blocks(hid_t d, hid_t space, size_t sz, const char *name, char *reason, size_t cap)
{
    hsize_t dims[H5S_MAX_RANK], block[H5S_MAX_RANK], start[H5S_MAX_RANK], count[H5S_MAX_RANK];
    const int nd = H5Sget_simple_extent_ndims(space);
    H5Sget_simple_extent_dims(space, dims, NULL);
    hid_t dcpl = H5Dget_create_plist(d);
    const int chunked = H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, nd, block) == nd;
    H5Pclose(dcpl);
    if (!chunked) { /* rows of the first axis */
        hsize_t row = 1;
        for (int i = 1; i < nd; i++) row *= dims[i] ? dims[i] : 1;
        for (int i = 0; i < nd; i++) block[i] = dims[i];
        if (nd > 0) block[0] = row >= VALIDATE_BLOCK ? 1 : (VALIDATE_BLOCK / row < dims[0] ? VALIDATE_BLOCK / row : dims[0]);
    }
    hsize_t per = 1;
    for (int i = 0; i < nd; i++) per *= block[i] ? block[i] : 1;
    void *buf = isth_malloc((size_t)per * sz + 1);
    if (!buf) {
        snprintf(reason, cap, "dataset /%s: out of memory for a block of %llu values", name, (unsigned long long)per);
        return 1;
    }
    for (int i = 0; i < nd; i++) start[i] = 0;
    int bad = 0;
    hssize_t total = H5Sget_simple_extent_npoints(space);
    while (!bad && total > 0) {
        hsize_t n = 1;
        for (int i = 0; i < nd; i++) {
            count[i] = start[i] + block[i] <= dims[i] ? block[i] : dims[i] - start[i];
            n *= count[i];
        }
        hid_t mspace = H5Screate_simple(1, &n, NULL);
        H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL);
        const herr_t err = H5Dread(d, sz == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE, mspace, space, H5P_DEFAULT, buf);
        H5Sclose(mspace);
        if (err < 0) {
            snprintf(reason, cap, "dataset /%s: checksum mismatch or truncated data", name);
            bad = 1;
            break;
        }
        for (hsize_t i = 0; i < n; i++)
            if (sz == 4 ? !isfinite(((float *)buf)[i]) : !isfinite(((double *)buf)[i])) {
                snprintf(reason, cap, "dataset /%s holds NaN or Inf", name);
                bad = 1;
                break;
            }
        /* next block: the last axis fastest */
        int axis = nd - 1;
        while (axis >= 0) {
            start[axis] += block[axis];
            if (start[axis] < dims[axis]) break;
            start[axis] = 0;
            axis--;
        }
        if (axis < 0) break;
    }
    isth_free(buf);
    return bad;
}

static herr_t visit_read(hid_t obj, const char *name, const H5O_info_t *info, void *data)
{
    VisitCtx *v = data;
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    if (d < 0) {
        snprintf(v->reason, v->cap, "dataset /%s cannot be opened", name);
        return 1;
    }
    hid_t space = H5Dget_space(d), type = H5Dget_type(d);
    const size_t sz = H5Tget_size(type);
    /* every isthmus dataset is float32 (tensors) or float64 (state) */
    const int is_float = H5Tget_class(type) == H5T_FLOAT && (sz == 4 || sz == 8);
    int bad = 0;
    if (!is_float) {
        snprintf(v->reason, v->cap, "dataset /%s: not floating point (the format stores float32/float64)", name);
        bad = 1;
    } else {
        bad = read_blocks(d, space, sz, name, v->reason, v->cap);
    }
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(d);
    v->datasets++;
    return bad;
}

static int read_string_attr(hid_t file, const char *name, char **out)
{
    *out = NULL;
    hid_t a = H5Aexists(file, name) > 0 ? H5Aopen(file, name, H5P_DEFAULT) : -1;
    if (a < 0) return -1;
    hid_t type = H5Aget_type(a);
    const size_t n = H5Tget_class(type) == H5T_STRING ? H5Tget_size(type) : 0;
    char *s = n ? isth_calloc(n + 1, 1) : NULL;
    const int ok = s && H5Aread(a, type, s) >= 0;
    H5Tclose(type);
    H5Aclose(a);
    if (!ok) {
        isth_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

/* One model-shaped group: every tensor of the stored config, with its
 * canonical shape and the fletcher32 filter (what the readers require). */
static int check_group(hid_t file, const Model *m, const char *group, char *reason, size_t cap)
{
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        char name[300];
        snprintf(name, sizeof name, "%s/%s", group, t->name);
        if (H5Lexists(file, group, H5P_DEFAULT) <= 0 || H5Lexists(file, name, H5P_DEFAULT) <= 0) {
            snprintf(reason, cap, "missing dataset %s", name);
            return ISTH_EINPUT;
        }
        hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
        if (d < 0) {
            snprintf(reason, cap, "dataset %s cannot be opened", name);
            return ISTH_EINPUT;
        }
        hid_t type = H5Dget_type(d);
        const int f32 = type >= 0 && H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4;
        if (type >= 0) H5Tclose(type);
        if (!f32) {
            H5Dclose(d);
            snprintf(reason, cap, "dataset %s is not float32", name);
            return ISTH_EINPUT;
        }
        hid_t space = H5Dget_space(d), dcpl = H5Dget_create_plist(d);
        hsize_t dims[H5S_MAX_RANK] = {0};
        const int nd = H5Sget_simple_extent_dims(space, dims, NULL);
        int shape_ok = nd == t->ndim;
        for (int k = 0; shape_ok && k < nd; k++) shape_ok = dims[k] == t->shape[k];
        unsigned flags = 0, cd[4];
        size_t ncd = 4;
        const int filtered = dcpl >= 0 && H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, &flags, &ncd, cd, 0, NULL,
                                                              NULL) >= 0;
        if (dcpl >= 0) H5Pclose(dcpl);
        H5Sclose(space);
        H5Dclose(d);
        if (!shape_ok) {
            snprintf(reason, cap, "dataset %s has a shape other than its config's model gives", name);
            return ISTH_EINPUT;
        }
        if (!filtered) {
            snprintf(reason, cap, "dataset %s has no fletcher32 checksum (damage could not be detected)", name);
            return ISTH_EINPUT;
        }
    }
    return ISTH_OK;
}

/* What the readers need: the stored config parses; /model has every tensor
 * of that model; a checkpoint (it has a `mode` attribute) also has every
 * group its mode restores, and its per-fragment state. */
static int check_structure(hid_t file, char *reason, size_t cap)
{
    char *text = NULL, *mode = NULL;
    if (read_string_attr(file, "config", &text) != 0) {
        snprintf(reason, cap, "attribute config unreadable");
        return ISTH_EINPUT;
    }
    Config cfg;
    const int was_quiet = status_set_quiet(1); /* the caller reports the reason, in one line */
    int rc = config_load_text(&cfg, text, "stored config", NULL, 0);
    status_set_quiet(was_quiet);
    status_discard_suppressed(); /* a verdict here, not an error to report later */
    isth_free(text);
    if (rc != ISTH_OK) {
        snprintf(reason, cap, "the stored config is not valid");
        return ISTH_EINPUT;
    }
    Model m;
    model_describe(&m, &cfg.model, 0, cfg.model.experts);
    rc = check_group(file, &m, "/model", reason, cap);
    if (rc != ISTH_OK || read_string_attr(file, "mode", &mode) != 0) return rc; /* a model file */
    long long first = 0, learners = 0;
    hid_t a;
    if ((a = H5Aexists(file, "first_learner") > 0 ? H5Aopen(file, "first_learner", H5P_DEFAULT) : -1) >= 0) {
        H5Aread(a, H5T_NATIVE_LLONG, &first);
        H5Aclose(a);
    }
    if ((a = H5Aexists(file, "learners") > 0 ? H5Aopen(file, "learners", H5P_DEFAULT) : -1) >= 0) {
        H5Aread(a, H5T_NATIVE_LLONG, &learners);
        H5Aclose(a);
    }
    /* the site's learners, as the stored config lays them out */
    char *site_name = NULL;
    long long want_first = 0, want_learners = 1;
    const int has_site = read_string_attr(file, "site", &site_name) == 0;
    /* a name that becomes a directory: the config's own rule, whatever the layout */
    int legal = has_site && site_name[0] != '\0';
    for (const char *p = has_site ? site_name : ""; *p; p++)
        legal &= (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
                 *p == '-';
    if (has_site && !legal) {
        snprintf(reason, cap, "attribute site = '%.64s' is not a site name (letters, digits, '_' and '-')", site_name);
        isth_free(site_name);
        isth_free(mode);
        return ISTH_EINPUT;
    }
    if (has_site && cfg.n_sites > 0) {
        want_learners = -1;
        for (int s = 0, l = 0; s < cfg.n_sites; s++) {
            const SiteConfig *sc = &cfg.sites[s];
            const int n = sc->ranks / (sc->learner_ranks > 0 ? sc->learner_ranks : sc->ranks);
            if (!strcmp(sc->name, site_name)) {
                want_first = l;
                want_learners = n;
            }
            l += n;
        }
    }
    if (want_learners < 0) {
        snprintf(reason, cap, "attribute site = '%.64s' is not a site of its stored config", site_name);
        isth_free(site_name);
        isth_free(mode);
        return ISTH_EINPUT;
    }
    isth_free(site_name);
    if (first != want_first || learners != want_learners) {
        snprintf(reason, cap, "attributes first_learner = %lld, learners = %lld; its stored config gives %lld, %lld",
                 first, learners, want_first, want_learners);
        isth_free(mode);
        return ISTH_EINPUT;
    }
    const int sync = !strcmp(mode, "sync"), bf = !strcmp(mode, "butterfly");
    if (strcmp(mode, cfg.outer.mode)) {
        snprintf(reason, cap, "attribute mode = '%.20s', its stored config has [outer] mode = %s", mode,
                 cfg.outer.mode);
        isth_free(mode);
        return ISTH_EINPUT;
    }
    isth_free(mode);
    if (sync) {
        rc = check_group(file, &m, "/inner/m", reason, cap);
        if (rc == ISTH_OK) rc = check_group(file, &m, "/inner/v", reason, cap);
    } else {
        if (!bf) rc = check_group(file, &m, "/outer/momentum", reason, cap);
        if (rc == ISTH_OK && !bf) rc = check_group(file, &m, "/outer/residual", reason, cap);
        for (long long k = first; rc == ISTH_OK && k < first + learners; k++) {
            static const char *const per_learner[] = {"model", "inner/m", "inner/v", "outer/anchor", "outer/momentum",
                                                      "outer/residual"};
            for (int g = 0; rc == ISTH_OK && g < (bf ? 6 : 3); g++) {
                char group[96];
                snprintf(group, sizeof group, "/learner_%lld/%s", k, per_learner[g]);
                rc = check_group(file, &m, group, reason, cap);
            }
        }
    }
    if (rc == ISTH_OK && (H5Lexists(file, "/state", H5P_DEFAULT) <= 0 ||
                          H5Lexists(file, "/state/fragments", H5P_DEFAULT) <= 0 ||
                          H5Lexists(file, "/state/started", H5P_DEFAULT) <= 0)) {
        snprintf(reason, cap, "missing dataset /state/fragments or /state/started");
        rc = ISTH_EINPUT;
    }
    return rc;
}

int ckpt_validate(const char *path, char *reason, size_t cap, long *step) { return ckpt_check(path, reason, cap, step, 1); }

int ckpt_check(const char *path, char *reason, size_t cap, long *step, int read_data)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    reason[0] = '\0';
    const char *why = h5_not_readable(path);
    if (why) {
        snprintf(reason, cap, "%s", why);
        return ISTH_EINPUT;
    }
    fletcher_register();
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        snprintf(reason, cap, "not a readable HDF5 file (truncated or corrupt)");
        return ISTH_EINPUT;
    }
    long long version = -1, s = -1;
    hid_t a = H5Aexists(file, "format_version") > 0 ? H5Aopen(file, "format_version", H5P_DEFAULT) : -1;
    if (a >= 0) {
        H5Aread(a, H5T_NATIVE_LLONG, &version);
        H5Aclose(a);
    }
    a = H5Aexists(file, "step") > 0 ? H5Aopen(file, "step", H5P_DEFAULT) : -1;
    if (a >= 0) {
        H5Aread(a, H5T_NATIVE_LLONG, &s);
        H5Aclose(a);
    }
    if (step) *step = (long)s;
    int rc = ISTH_OK;
    if (version != H5IO_FORMAT_VERSION) {
        snprintf(reason, cap, "format_version %lld, this build reads %d", version, H5IO_FORMAT_VERSION);
        rc = ISTH_EINPUT;
    } else if (s < 0 || H5Aexists(file, "config") <= 0) {
        snprintf(reason, cap, "missing attributes (step, config)");
        rc = ISTH_EINPUT;
    } else if (!counters_valid(file, reason, cap)) {
        rc = ISTH_EINPUT;
    } else {
        rc = check_structure(file, reason, cap);
        VisitCtx v = {reason, cap, 0};
        if (rc == ISTH_OK && read_data && H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit_read, &v) != 0)
            rc = ISTH_EINPUT;
    }
    H5Fclose(file);
    return rc;
}

/* The counters a resume carries on: tokens finite and not negative, the
 * data's kind one the reader knows. */
static int counters_valid(hid_t file, char *reason, size_t cap)
{
    if (H5Aexists(file, "tokens") > 0) {
        double tokens = 0;
        hid_t a = H5Aopen(file, "tokens", H5P_DEFAULT);
        const herr_t e = a >= 0 ? H5Aread(a, H5T_NATIVE_DOUBLE, &tokens) : -1;
        if (a >= 0) H5Aclose(a);
        if (e < 0 || !isfinite(tokens) || tokens < 0) {
            snprintf(reason, cap, "attribute tokens = %g is not a count of tokens", tokens);
            return 0;
        }
    }
    if (H5Aexists(file, "data_width") > 0) {
        long long w = 0;
        hid_t a = H5Aopen(file, "data_width", H5P_DEFAULT);
        const herr_t e = a >= 0 ? H5Aread(a, H5T_NATIVE_LLONG, &w) : -1;
        if (a >= 0) H5Aclose(a);
        if (e < 0 || (w != 1 && w != 2 && w != 4)) {
            snprintf(reason, cap, "attribute data_width = %lld is not 1, 2 or 4 bytes per token", w);
            return 0;
        }
    }
    return 1;
}

/* ---- inspect ------------------------------------------------------------------ */

static herr_t visit_print(hid_t obj, const char *name, const H5O_info_t *info, void *data)
{
    (void)data;
    if (info->type == H5O_TYPE_GROUP) {
        printf("  /%s/\n", name);
        return 0;
    }
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    if (d < 0) return 0;
    hid_t space = H5Dget_space(d);
    hsize_t dims[H5S_MAX_RANK];
    int nd = H5Sget_simple_extent_dims(space, dims, NULL);
    printf("  /%s [", name);
    for (int i = 0; i < nd; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
    printf("]\n");
    H5Sclose(space);
    H5Dclose(d);
    return 0;
}

int ckpt_inspect(const char *path)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    printf("file: %s\n", path);
    fletcher_register();
    hid_t file = !h5_not_readable(path) ? H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    if (file >= 0) {
        static const char *const names[] = {"format_version", "step", "outer_steps", "tokens", "written", "site",
                                            "mode", "first_learner", "learners", "exchanges", "adam_t",
                                            "lineage", "every_site"};
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
            if (H5Aexists(file, names[i]) <= 0) continue;
            hid_t a = H5Aopen(file, names[i], H5P_DEFAULT);
            hid_t type = H5Aget_type(a);
            if (H5Tget_class(type) == H5T_STRING) {
                size_t n = H5Tget_size(type);
                char *s = isth_calloc(n + 1, 1);
                if (s && H5Aread(a, type, s) >= 0) printf("%-15s %s\n", names[i], s);
                isth_free(s);
            } else if (H5Tget_class(type) == H5T_FLOAT) {
                double v = 0;
                H5Aread(a, H5T_NATIVE_DOUBLE, &v);
                printf("%-15s %.0f\n", names[i], v);
            } else {
                long long v = 0;
                H5Aread(a, H5T_NATIVE_LLONG, &v);
                printf("%-15s %lld\n", names[i], v);
            }
            H5Tclose(type);
            H5Aclose(a);
        }
        printf("datasets:\n");
        H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit_print, NULL);
        H5Fclose(file);
    }
    char reason[512];
    if (ckpt_validate(path, reason, sizeof reason, NULL) != ISTH_OK) {
        printf("verdict: INVALID: %s\n", reason);
        fflush(stdout);
        return isth_fail(ISTH_EINPUT, "%s: invalid: %s", path, reason);
    }
    printf("verdict: valid (every dataset read, checksums verified)\n");
    return ISTH_OK;
}
