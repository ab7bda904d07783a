/* fletcher.h — HDF5's Fletcher-32 checksum filter (H5Z_FILTER_FLETCHER32),
 * the same bytes on disk, computed faster.
 *
 * Why: checkpoints carry a Fletcher-32 checksum per chunk (the file format), and
 * HDF5's own filter sums two bytes at a time and then copies every chunk
 * into a fresh buffer to append four bytes; at checkpoint sizes that was a
 * third of the write's CPU time. This filter computes the identical value
 * (HDF5's blocks of 360 words and its folds, the word sums done eight lanes
 * at a time) and appends the checksum in place, so files written here are
 * read and verified by any HDF5, and files from any HDF5 are verified here.
 *
 * Owns: the checksum and the filter class it registers in place of HDF5's
 * for this process (through libhdf5's H5Z_register: the public H5Zregister
 * refuses ids below 256).
 * Must not: change what is stored: the bytes, their order and the
 * checksum's encoding are HDF5's (little-endian; on reading, also the
 * byte-swapped form that HDF5 before 1.6.3 wrote, as HDF5 accepts it).
 */
#ifndef ISTHMUS_FLETCHER_H
#define ISTHMUS_FLETCHER_H

#include <stddef.h>
#include <stdint.h>

/* HDF5's Fletcher-32 of len bytes (H5_checksum_fletcher32's value). */
uint32_t fletcher32(const void *data, size_t len);

/* Register the filter (once per process; later calls do nothing).
 * Returns 0, or -1 when HDF5 refused it (HDF5's own filter stays). */
int fletcher_register(void);

/* Bytes checksummed by this filter so far (0: HDF5's filter is in use). */
uint64_t fletcher_filtered_bytes(void);

#endif
