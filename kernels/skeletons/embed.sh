#!/bin/sh
# Writes, on stdout, the C header that holds each skeleton given (a real CUDA
# file, kernels/skeletons/NAME.cuh) as the string mk_skeleton_NAME, which the
# generators (core/codegen/*.c) paste into a kernel's source.
# Comments are stripped first (a line left blank by that goes too), so that
# editing one changes neither the generated source nor the kernel cache's key.
set -eu
# The comments of C source on stdin removed, string and character literals
# kept as they are.
strip_comments() {
    awk '
    {
        line = $0; out = ""; had = 0; i = 1; n = length(line)
        if (incomment) {
            e = index(line, "*/")
            if (!e) next
            incomment = 0; had = 1; i = e + 2
        }
        while (i <= n) {
            c = substr(line, i, 1); d = substr(line, i + 1, 1)
            if (quote != "") {
                out = out c
                if (c == "\\") { out = out d; i += 2; continue }
                if (c == quote) quote = ""
                i++
            } else if (c == "\"" || c == "\047") {
                quote = c; out = out c; i++
            } else if (c == "/" && d == "/") {
                had = 1; break
            } else if (c == "/" && d == "*") {
                had = 1
                e = index(substr(line, i + 2), "*/")
                if (!e) { incomment = 1; break }
                i += e + 3
            } else {
                out = out c; i++
            }
        }
        quote = ""
        if (had) {
            sub(/[ \t]+$/, "", out)
            if (out ~ /^[ \t]*$/) next
        }
        print out
    }'
}
echo "/* Written by kernels/skeletons/embed.sh from the skeletons (kernels/skeletons): do not edit. */"
for f in "$@"; do
    echo "static const char mk_skeleton_$(basename "$f" .cuh)[] ="
    strip_comments < "$f" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/'
    echo "    ;"
done
