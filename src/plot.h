/* plot.h — `isthmus plot`: PNG charts of runs from their metrics.jsonl.
 *
 * Owns: reading the step, eval, run and summary lines of each run
 * directory's metrics.jsonl (the fields docs/configuration.md lists), the
 * data files and gnuplot script it writes into a private temporary
 * directory, and running gnuplot (Debian's gnuplot-nox) to draw four
 * panels: bits per byte on each eval set and training loss against
 * tokens, and cumulative inter-site bytes against steps, one line per run
 * labelled with its directory, mode and codec. The PNG is written under a
 * temporary name and renamed when gnuplot succeeded.
 * Must not: write into the run directories; compute any metric itself
 * beyond summing the bytes of each step.
 */
#ifndef ISTHMUS_PLOT_H
#define ISTHMUS_PLOT_H

/* Chart the runs (directories holding metrics.jsonl) into `png`, width x
 * height pixels. ISTH_EINPUT naming a missing or empty metrics file or a
 * bad size, ISTH_ERUNTIME when gnuplot is missing or fails. */
int plot_runs(const char *const *runs, int n_runs, const char *png, int width, int height);

#endif
