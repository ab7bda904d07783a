/* version.h — which build this is: `isthmus --version`, the metrics' start
 * record and the federated join (both sites must run the same build).
 * Owns: the version text. Must not: anything else.
 */
#ifndef ISTHMUS_VERSION_H
#define ISTHMUS_VERSION_H

/* "0.1.0+<sources>" (scripts/source_id.sh: git's short hash, "-dirty." and
 * a hash with local changes; outside a git checkout a release tarball's
 * recorded commit while its sources are unchanged, else a hash of them):
 * what the sites compare. */
const char *isthmus_build(void);
/* The configure options this build was made with. */
const char *isthmus_configure_args(void);

#endif
