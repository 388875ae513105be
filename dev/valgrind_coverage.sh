#!/bin/sh
# Shows that spec/valgrind.sh's workload reaches every line of our own C
# (core/, lua/) that an earlier revision's reached: builds a CPU-only tree with
# gcov (build-gcov/, as make valgrind's: CUDA=0, no -march=native), runs REV's
# spec/valgrind.sh commands without valgrind, then the checkout's, and compares
# the sets of lines each executed at least once. Both runs take one seed
# (MK_SEED, default 1), so that the op table's random MK_CASES=quick sample is
# the same. Prints both counts and the lines the checkout's workload no longer
# reaches; exits non-zero if there are any.
#
#   sh dev/valgrind_coverage.sh [REV]        (default HEAD~1)
REV=${1:-HEAD~1}
cd "$(dirname "$0")/.." || exit 2
B=build-gcov
export MK_SEED=${MK_SEED:-1}
tmp=$(mktemp -d)
make -s BUILD=$B CUDA=0 ARCH= OPT=-O1 SAN=--coverage all examples-build > "$tmp/make.out" 2>&1 ||
    { cat "$tmp/make.out"; exit 2; }

# lines(OUT): "file:line" of every line of core/ and lua/ that ran, from the .gcda files
lines() {
    find $B -name '*.gcda' > "$tmp/gcda"
    (cd "$tmp" && xargs gcov -j -p < "$tmp/gcda" > /dev/null 2>&1)
    python3 - "$tmp" "$(pwd)" > "$1" <<'PY'
import glob, gzip, json, os, sys
tmp, root = sys.argv[1], sys.argv[2]
seen = set()
for path in glob.glob(os.path.join(tmp, "*.gcov.json.gz")):
    data = json.load(gzip.open(path))
    for f in data["files"]:
        name = os.path.relpath(os.path.join(data.get("current_working_directory", root), f["file"]), root)
        if not (name.startswith("core/") or name.startswith("lua/")):
            continue
        for l in f["lines"]:
            if l["count"] > 0:
                seen.add("%s:%d" % (name, l["line_number"]))
    os.remove(path)
print("\n".join(sorted(seen)))
PY
    find $B -name '*.gcda' -delete
}

find $B -name '*.gcda' -delete
# REV's script with its valgrind command emptied: the same commands, natively
git show "$REV:spec/valgrind.sh" | sed 's/^VG=.*/VG=/' > spec/.valgrind_rev.sh
sh spec/.valgrind_rev.sh $B > "$tmp/old.out" 2>&1
echo "$REV's workload: exit $? ($(grep -c FAILED "$tmp/old.out") failed)"
rm -f spec/.valgrind_rev.sh
lines "$tmp/old.lines"
VALGRIND= sh spec/valgrind.sh $B > "$tmp/new.out" 2>&1
echo "this checkout's workload: exit $? ($(grep -c FAILED "$tmp/new.out") failed)"
lines "$tmp/new.lines"
lost=$(comm -23 "$tmp/old.lines" "$tmp/new.lines")
echo "lines of core/ and lua/ reached: $REV $(wc -l < "$tmp/old.lines"), this checkout $(wc -l < "$tmp/new.lines"), only $REV: $(printf '%s' "$lost" | grep -c .)"
[ -n "$lost" ] && printf '%s\n' "$lost"
rm -rf "$tmp"
[ -z "$lost" ]
