# shellcheck shell=bash
# optim_variant.sh — sourced by horizon.sh and bench_optim.sh: the name of an
# optimiser run may carry Shampoo's settings: shampoo-b64 (train.precond_block
# = 64), shampoo-e40 (train.precond_every = 40), shampoo-s2
# (train.precond_stats_every = 2), or several (shampoo-b64-e40).
# optim_flags NAME prints the --set flags beyond train.optimizer=${NAME%%-*};
# an unknown variant exits 2 (call it as flags=$(optim_flags "$name") || exit 2).
optim_flags() {
    local v
    case $1 in *-*) ;; *) return 0 ;; esac
    case $1 in shampoo-*) ;; *) echo "$(basename "$0"): '$1': only shampoo has variants" >&2; exit 2 ;; esac
    for v in $(echo "${1#*-}" | tr '-' ' '); do
        case $v in
        b[1-9] | b[1-9]*[0-9]) echo "--set train.precond_block=${v#b}" ;;
        e[1-9] | e[1-9]*[0-9]) echo "--set train.precond_every=${v#e}" ;;
        s[1-9] | s[1-9]*[0-9]) echo "--set train.precond_stats_every=${v#s}" ;;
        *) echo "$(basename "$0"): unknown optimiser variant '$v' in '$1'" >&2; exit 2 ;;
        esac
    done
}
