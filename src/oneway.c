/* oneway.c — see oneway.h. */
#include "oneway.h"

#include "alloc.h"
#include "status.h"

int oneway_alloc(OneWay *f, size_t values, size_t bytes, int site, const char *what)
{
    f->buf = isth_malloc(ONEWAY_ROOM + bytes);
    if (!f->buf) return isth_fail(ISTH_ERUNTIME, "%s: out of memory for %zu bytes", what, bytes);
    f->values = values;
    f->bytes = bytes;
    f->site = site;
    return ISTH_OK;
}

void oneway_send(OneWay *f, int peer, int tag)
{
    link_msg_init_borrowed(&f->m, peer, tag, ONEWAY_ROOM + f->bytes, 0, 0);
    f->m.send = f->buf;
    f->m.recv_done = 1; /* one way */
}

int oneway_recv(Link *l, OneWay *f, int peer, int tag)
{
    link_msg_init_borrowed(&f->m, peer, tag, 0, ONEWAY_ROOM + f->bytes, 0);
    f->m.recv = f->buf;
    f->m.send_posted = 2; /* one way */
    return link_post_recv(l, &f->m);
}

int oneway_await(Link *l, OneWay *fr, int n, const char *what, unsigned char *late, double *waited)
{
    LinkMsg **msgs = isth_malloc(sizeof(LinkMsg *) * (size_t)(n + 1));
    unsigned char *missed = isth_calloc((size_t)n + 1, 1);
    if (!msgs || !missed) {
        isth_free(msgs);
        isth_free(missed);
        return isth_fail(ISTH_ERUNTIME, "%s: out of memory", what);
    }
    for (int i = 0; i < n; i++) msgs[i] = &fr[i].m;
    double w = 0.0;
    const int rc = link_wait_live(l, msgs, n, what, missed, &w);
    for (int i = 0; rc == ISTH_OK && i < n; i++)
        if (missed[i]) late[fr[i].site] = 1;
    if (w > *waited) *waited = w;
    isth_free(msgs);
    isth_free(missed);
    return rc;
}

void oneway_release(OneWay *fr, int n)
{
    for (int i = 0; i < n; i++)
        if (link_msg_free(&fr[i].m) && !fr[i].kept) isth_free(fr[i].buf);
}
