/* test_faults.c — the failure policy's building blocks, on one rank:
 *  - MPI errors are returned, not fatal: a send to a rank that does not
 *    exist, a broadcast from a root that does not exist become ISTH_ERUNTIME
 *    through CHECK_MPI (with the default handler the process would abort);
 *  - a receive nobody answers ends at the link deadline, and freeing its
 *    message cancels the request first;
 *  - messages and collectives in pieces of 1 KiB deliver exactly what one
 *    piece would;
 *  - the test hooks parse as documented (SITE:N, RANK:STEP, one failure).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <mpi.h>

#include "alloc.h"
#include "coll.h"
#include "fault.h"
#include "link.h"
#include "status.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void mpi_errors_are_returned(void **state)
{
    (void)state;
    Link l;
    link_init(&l, MPI_COMM_WORLD, 1.0, "a");
    LinkMsg m;
    assert_int_equal(link_msg_alloc(&m, 7, LINK_TAG_CONTROL, 64, 64, 0), ISTH_OK); /* rank 7 of a 1-rank world */
    memset(m.send, 0, 64);
    assert_int_equal(link_post_send(&l, &m), ISTH_ERUNTIME);
    link_msg_free(&m);
    char buf[16] = {0};
    assert_int_equal(coll_bcast_bytes(MPI_COMM_WORLD, buf, sizeof buf, 3), ISTH_ERUNTIME);
}

static void unanswered_receive_hits_deadline(void **state)
{
    (void)state;
    Link l;
    link_init(&l, MPI_COMM_WORLD, 0.2, "a");
    LinkMsg m;
    assert_int_equal(link_msg_alloc(&m, 0, LINK_TAG(LINK_SITE_VALUES, 3), 128, 128, 0), ISTH_OK);
    assert_int_equal(link_post_recv(&l, &m), ISTH_OK);
    m.send_posted = 2; /* nothing to send: only the receive is waited on */
    LinkMsg *msgs[1] = {&m};
    const double t0 = now_s();
    assert_int_equal(link_wait(&l, msgs, 1, "test"), ISTH_ERUNTIME);
    const double dt = now_s() - t0;
    assert_true(dt >= 0.2 && dt < 5.0);
    link_msg_free(&m); /* cancels the receive, then frees */
    /* nothing left posted under that tag: a later self-message is received normally */
    int flag = 0;
    MPI_Iprobe(0, LINK_TAG(LINK_SITE_VALUES, 3), MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    assert_int_equal(flag, 0);
}

static void pieces_deliver_the_same_bytes(void **state)
{
    (void)state;
    coll_set_max_message(1024);
    Link l;
    link_init(&l, MPI_COMM_WORLD, 10.0, "a");
    const size_t n = 10000 + sizeof(LinkHeader); /* 10 pieces, the last partial */
    LinkMsg m;
    assert_int_equal(link_msg_alloc(&m, 0, LINK_TAG(LINK_SITE_VALUES, 5), n, n, 0), ISTH_OK);
    for (size_t i = 0; i < n; i++) m.send[i] = (unsigned char)(i * 7 + 3);
    link_frame(&l, 0, m.send, 0, LINK_SITE_VALUES, 5, 0, 1, 10000, 10000);
    assert_int_equal(link_post_recv(&l, &m), ISTH_OK);
    assert_int_equal(m.recv_pieces, 10);
    LinkMsg *msgs[1] = {&m};
    assert_int_equal(link_wait(&l, msgs, 1, "pieces"), ISTH_OK);
    assert_memory_equal(m.send, m.recv, n);
    assert_null(link_check(&l, 0, m.recv, n, LINK_SITE_VALUES, 5, 1, 10000, 10000));
    for (size_t i = sizeof(LinkHeader); i < n; i++) assert_int_equal(m.recv[i], (unsigned char)(i * 7 + 3));
    link_msg_free(&m);
    /* collectives in pieces: a sum and a gather of 1000 floats in 250-float pieces */
    float v[1000], all[1000];
    for (int i = 0; i < 1000; i++) v[i] = (float)i * 0.5f;
    assert_int_equal(coll_allgather_floats(MPI_COMM_WORLD, v, 1000, all), ISTH_OK);
    assert_memory_equal(v, all, sizeof v);
    assert_int_equal(coll_allreduce_comm(MPI_COMM_WORLD, v, 1000, MPI_FLOAT, sizeof(float), MPI_SUM), ISTH_OK);
    assert_memory_equal(v, all, sizeof v);
    coll_set_max_message((size_t)1 << 30);
}

/* Frames between two sites of a run: sealed with the pair's key, opened
 * only by the right receiver with the right key, and every change to any
 * byte of the frame, a frame of another run or epoch, a frame in the
 * wrong direction and a replayed (older) frame are refused. The sites'
 * ranks are made up (the communicator is this process: peer rank 0), so
 * each end is a Link with its own site and rank. */
static void frame_into(Link *from, int to_rank, unsigned char *buf, size_t n, uint64_t exchange)
{
    for (size_t i = sizeof(LinkHeader); i < n; i++) buf[i] = (unsigned char)(i * 13 + 1);
    link_frame(from, to_rank, buf, 3, LINK_SITE_VALUES, 2, 0, exchange, 77, n - sizeof(LinkHeader));
}

static void frames_are_sealed_and_checked(void **state)
{
    (void)state;
    const int first[3] = {0, 1, 3}; /* site a: rank 0; site b: ranks 1 and 2 */
    unsigned char key[SEAL_KEY_BYTES], epoch[SEAL_EPOCH_BYTES], master[SEAL_KEY_BYTES], other[SEAL_KEY_BYTES];
    for (int i = 0; i < SEAL_KEY_BYTES; i++) key[i] = (unsigned char)i, epoch[i] = (unsigned char)(200 - i);
    seal_master(master, key, "run-1", epoch);
    for (int encrypt = 0; encrypt < 2; encrypt++) {
        Link a, b;
        link_init(&a, MPI_COMM_SELF, 1.0, "a");
        link_init(&b, MPI_COMM_SELF, 1.0, "b");
        link_set_keys(&a, master, encrypt, 0, first, 2);
        link_set_keys(&b, master, encrypt, 1, first, 2);
        a.rank = 0, b.rank = 1;
        enum { N = sizeof(LinkHeader) + 1000 };
        unsigned char frame[N], copy[N];
        frame_into(&a, 1, frame, N, 5);
        /* on the wire: the payload is unreadable when encrypted, as sent when not */
        int same = 1;
        for (size_t i = sizeof(LinkHeader); i < N; i++) same &= frame[i] == (unsigned char)(i * 13 + 1);
        assert_int_equal(same, !encrypt);
        memcpy(copy, frame, N);
        assert_null(link_check(&b, 0, frame, N, LINK_SITE_VALUES, 2, 5, 77, 1000));
        for (size_t i = sizeof(LinkHeader); i < N; i++) assert_int_equal(frame[i], (unsigned char)(i * 13 + 1));
        /* one flipped bit anywhere: the nonce, the tag, every header field, the payload */
        const size_t where[] = {0, SEAL_NONCE_BYTES, LINK_HEADER_AD_OFFSET, offsetof(LinkHeader, exchange),
                                offsetof(LinkHeader, from_rank), offsetof(LinkHeader, flags), sizeof(LinkHeader),
                                N - 1};
        for (size_t w = 0; w < sizeof where / sizeof *where; w++) {
            memcpy(frame, copy, N);
            frame[where[w]] ^= 4;
            const char *bad = link_check(&b, 0, frame, N, LINK_SITE_VALUES, 2, 5, 77, 1000);
            assert_non_null(bad);
            assert_string_equal(bad, "failed authentication");
        }
        /* a replay: the frame of exchange 5 where 6 is expected */
        memcpy(frame, copy, N);
        assert_string_equal(link_check(&b, 0, frame, N, LINK_SITE_VALUES, 2, 6, 77, 1000),
                            "unexpected fragment or exchange");
        /* misdirected: the other rank of site b opens it (the same pair's key) and refuses it */
        Link e;
        link_init(&e, MPI_COMM_SELF, 1.0, "b");
        link_set_keys(&e, master, encrypt, 1, first, 2);
        e.rank = 2;
        memcpy(frame, copy, N);
        assert_string_equal(link_check(&e, 0, frame, N, LINK_SITE_VALUES, 2, 5, 77, 1000), "from or to the wrong rank");
        /* back to its sender, or opened by site a as if from b: the other direction's key */
        memcpy(frame, copy, N);
        assert_string_equal(link_check(&a, 1, frame, N, LINK_SITE_VALUES, 2, 5, 77, 1000), "failed authentication");
        /* a frame of another epoch (a restart) or another run */
        unsigned char epoch2[SEAL_EPOCH_BYTES];
        memcpy(epoch2, epoch, sizeof epoch2);
        epoch2[31] ^= 1;
        const char *runs[2] = {"run-1", "run-2"};
        const unsigned char *epochs[2] = {epoch2, epoch};
        for (int k = 0; k < 2; k++) {
            Link c;
            link_init(&c, MPI_COMM_SELF, 1.0, "a");
            seal_master(other, key, runs[k], epochs[k]);
            link_set_keys(&c, other, encrypt, 0, first, 2);
            c.rank = 0;
            frame_into(&c, 1, frame, N, 5);
            assert_string_equal(link_check(&b, 0, frame, N, LINK_SITE_VALUES, 2, 5, 77, 1000),
                                "failed authentication");
        }
        /* a frame cut short or padded: refused before anything is read */
        memcpy(frame, copy, N);
        assert_string_equal(link_check(&b, 0, frame, N - 1, LINK_SITE_VALUES, 2, 5, 77, 1000), "wrong payload size");
        assert_string_equal(link_check(&b, 0, frame, 10, LINK_SITE_VALUES, 2, 5, 77, 1000), "short frame");
        /* the receiver's own expectations: encryption as agreed */
        Link d;
        link_init(&d, MPI_COMM_SELF, 1.0, "b");
        link_set_keys(&d, master, !encrypt, 1, first, 2);
        d.rank = 1;
        memcpy(frame, copy, N);
        assert_string_equal(link_check(&d, 0, frame, N, LINK_SITE_VALUES, 2, 5, 77, 1000), "encryption not as agreed");
        assert_true(b.auth_failures >= 10);
    }
}

static void hooks_parse_as_documented(void **state)
{
    (void)state;
    setenv("ISTHMUS_TEST_HOOK", "b:7", 1);
    assert_int_equal(fault_hook_for("ISTHMUS_TEST_HOOK", "b"), 7);
    assert_int_equal(fault_hook_for("ISTHMUS_TEST_HOOK", "bb"), 0);
    assert_int_equal(fault_hook_for("ISTHMUS_TEST_HOOK", "a"), 0);
    unsetenv("ISTHMUS_TEST_HOOK");
    assert_int_equal(fault_hook_for("ISTHMUS_TEST_HOOK", "b"), 0);
    /* rank 0's first allocation during step 4 fails, once */
    setenv("ISTHMUS_FAIL_ALLOC", "0:4", 1);
    fault_set_step(3);
    void *p = isth_malloc(16);
    assert_non_null(p);
    free(p);
    fault_set_step(4);
    assert_null(isth_malloc(16));
    p = isth_calloc(4, 4);
    assert_non_null(p);
    free(p);
    unsetenv("ISTHMUS_FAIL_ALLOC");
    fault_set_step(0);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    status_set_quiet(1);
    if (fault_mpi_errors_return(MPI_COMM_WORLD) != ISTH_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mpi_errors_are_returned),
        cmocka_unit_test(unanswered_receive_hits_deadline),
        cmocka_unit_test(pieces_deliver_the_same_bytes),
        cmocka_unit_test(frames_are_sealed_and_checked),
        cmocka_unit_test(hooks_parse_as_documented),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
