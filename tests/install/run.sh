#!/bin/sh
# run.sh -- the install test: `make install` into a temporary prefix, then a user's program (hello.c) built against
# the installed tree with pkg-config, linked against the shared library and statically, and run; the installed
# program, man page and pkg-config file; DESTDIR staging and make uninstall.
#
#   sh tests/install/run.sh [BUILD_DIR]     (make test-install; make test runs it as BUILD_DIR/tests/test-install)
#
# One PASS/FAIL line per check, then "N passed, M failed[, K skipped]"; exit status 1 on a failure.
B=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd) || exit 2
cd "$ROOT" || exit 2
CC=${CC:-cc}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/nbg-install.XXXXXX") || { echo "FAIL install no temporary directory"; exit 1; }
trap 'rm -rf "$TMP"' EXIT
trap 'rm -rf "$TMP"; exit 130' INT TERM

pass=0
fail=0
skip=0
ok() { echo "PASS install $1"; pass=$((pass + 1)); }
bad() { echo "FAIL install $1"; fail=$((fail + 1)); }
check() { # check WHAT COMMAND...: PASS when the command succeeds
    what=$1; shift
    if "$@" > "$TMP/check.out" 2>&1; then ok "$what"; else bad "$what"; sed 's/^/    /' "$TMP/check.out" | head -20; fi
}
summary() {
    line="$pass passed, $fail failed"
    [ "$skip" -gt 0 ] && line="$line, $skip skipped"
    echo "$line"
    [ "$fail" -eq 0 ]
    exit $?
}

# the make that runs us (make test) passes its command-line variables on in MAKEFLAGS; its jobserver is not ours
MAKEFLAGS=$(printf '%s' "${MAKEFLAGS:-}" | sed 's/--jobserver-[a-z]*=[^ ]*//g')
export MAKEFLAGS
MAKE_CMD=${MAKE:-make}

ver=$(sed -n 's/^#define NBG_VERSION "\([0-9.]*\)"$/\1/p' include/nbgrad.h)
major=${ver%%.*}
P=$TMP/usr
if ! $MAKE_CMD --no-print-directory -s B="$B" install PREFIX="$P" DESTDIR= LDCONFIG=true > "$TMP/make.out" 2>&1; then
    bad "make install PREFIX=$P failed"
    sed 's/^/    /' "$TMP/make.out" | tail -n 30
    summary
fi
ok "make install PREFIX=\$TMP/usr"
echo "installed:"
(cd "$P" && find . \( -type f -o -type l \) | sort | while read -r f; do
    if [ -L "$f" ]; then echo "  $f -> $(readlink "$f")"; else echo "  $f ($(wc -c < "$f") bytes)"; fi
done)

for f in bin/nbgrad lib/libnbgrad.so.$ver lib/libnbgrad.a include/nbgrad.h include/nbgrad_params.def \
         lib/pkgconfig/nbgrad.pc share/man/man1/nbgrad.1; do
    check "installs $f" test -f "$P/$f" -a -s "$P/$f"
done
check "lib/libnbgrad.so.$major -> libnbgrad.so.$ver" \
    test "$(readlink "$P/lib/libnbgrad.so.$major")" = "libnbgrad.so.$ver"
check "lib/libnbgrad.so -> libnbgrad.so.$major" test "$(readlink "$P/lib/libnbgrad.so")" = "libnbgrad.so.$major"
check "bin/nbgrad is executable" test -x "$P/bin/nbgrad"

# the shared library: its soname, what it needs (no CUDA runtime), what it exports (nbg_ only)
so=$P/lib/libnbgrad.so.$ver
readelf -d "$so" > "$TMP/dyn" 2>&1
needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/ \1/p' "$TMP/dyn" | tr -d '\n')
echo "libnbgrad.so.$ver: $(wc -c < "$so") bytes; NEEDED:$needed"
check "the shared library's soname is libnbgrad.so.$major" grep -q "(SONAME).*\[libnbgrad.so.$major\]" "$TMP/dyn"
check "the shared library needs no CUDA library" sh -c "! grep '(NEEDED)' '$TMP/dyn' | grep -i -q -E 'cuda|nvidia'"
check "the shared library holds no CUDA runtime" sh -c "! nm -D '$so' | grep -q -E ' cuda[A-Z]|__cuda'"
check "the shared library exports nbg_ functions only" \
    sh -c "nm -D --defined-only '$so' | awk 'NF == 3 { print \$3 }' | grep -q '^nbg_simulate$' && \
           ! nm -D --defined-only '$so' | awk 'NF == 3 { print \$3 }' | grep -v -q '^nbg_'"

# pkg-config
PKG_CONFIG_PATH=$P/lib/pkgconfig
export PKG_CONFIG_PATH
if command -v pkg-config > /dev/null 2>&1; then
    check "pkg-config --modversion nbgrad is $ver" test "$(pkg-config --modversion nbgrad 2>&1)" = "$ver"
    cflags=$(pkg-config --cflags nbgrad)
    libs=$(pkg-config --libs nbgrad)
    slibs=$(pkg-config --static --libs nbgrad)
    echo "pkg-config --cflags --libs nbgrad: $cflags $libs"
    echo "pkg-config --static --libs nbgrad: $slibs"
    check "pkg-config's flags name the prefix" sh -c "echo '$cflags $libs' | grep -q -F -e '-I$P/include' && \
        echo '$libs' | grep -q -F -e '-L$P/lib'"
    # a dynamic link: the program needs libnbgrad.so.MAJOR, found through LD_LIBRARY_PATH
    if $CC tests/install/hello.c $cflags $libs -o "$TMP/hello-dyn" > "$TMP/cc.out" 2>&1; then
        ok "cc hello.c \$(pkg-config --cflags --libs nbgrad)"
        check "the program needs libnbgrad.so.$major" \
            sh -c "readelf -d '$TMP/hello-dyn' | grep -q 'NEEDED.*libnbgrad.so.$major'"
        LD_LIBRARY_PATH=$P/lib "$TMP/hello-dyn" > "$TMP/hello.out" 2>&1
        rc=$?
        cat "$TMP/hello.out"
        pass=$((pass + $(grep -c '^PASS ' "$TMP/hello.out")))
        fail=$((fail + $(grep -c '^FAIL ' "$TMP/hello.out")))
        [ $rc -eq 0 ] || bad "hello (shared) exited with status $rc"
    else
        bad "cc hello.c \$(pkg-config --cflags --libs nbgrad)"; sed 's/^/    /' "$TMP/cc.out" | head -20
    fi
    # a static link of libnbgrad (-l:libnbgrad.a: beside the .so, -lnbgrad would take the .so) with Libs.private
    slibs_a=$(printf '%s' "$slibs" | sed 's/-lnbgrad\b/-l:libnbgrad.a/')
    if $CC tests/install/hello.c $cflags $slibs_a -o "$TMP/hello-static" > "$TMP/cc.out" 2>&1; then
        ok "cc hello.c with pkg-config --static --libs nbgrad (libnbgrad.a)"
        check "the static program needs no libnbgrad.so" \
            sh -c "! readelf -d '$TMP/hello-static' | grep -q 'NEEDED.*libnbgrad'"
        "$TMP/hello-static" > "$TMP/hello.out" 2>&1
        rc=$?
        sed 's/^\(PASS\|FAIL\) hello/\1 hello-static/' "$TMP/hello.out"
        pass=$((pass + $(grep -c '^PASS ' "$TMP/hello.out")))
        fail=$((fail + $(grep -c '^FAIL ' "$TMP/hello.out")))
        [ $rc -eq 0 ] || bad "hello (static) exited with status $rc"
    else
        bad "cc hello.c with pkg-config --static --libs nbgrad (libnbgrad.a)"; sed 's/^/    /' "$TMP/cc.out" | head -20
    fi
else
    echo "SKIP install pkg-config is not installed (make deps installs it)"
    skip=$((skip + 1))
fi

# the installed program
out=$("$P/bin/nbgrad" --version 2>&1)
check "nbgrad --version says $ver ($out)" sh -c "printf '%s' '$out' | grep -q -F '$ver'"

# the formats plug-in and the MPI program, where the build has them: the installed program finds them in
# lib/nbgrad (src/plugin.c), not in the build tree
if [ -f "$B/nbgrad-formats.so" ]; then
    check "installs lib/nbgrad/nbgrad-formats.so" test -f "$P/lib/nbgrad/nbgrad-formats.so"
    mkdir -p "$TMP/run"
    check "the installed nbgrad writes NXmx and CBF through lib/nbgrad/nbgrad-formats.so" sh -c "cd '$TMP/run' && \
        '$P/bin/nbgrad' -detpixels 8 -cell 70 80 90 90 90 90 -default_F 100 -N 5 -nxsfile a.nxs -cbffile a.cbf && \
        test -s a.nxs && test -s a.cbf"
fi
if [ -f "$B/nbgrad-mpi" ]; then
    check "installs lib/nbgrad/nbgrad-mpi" test -x "$P/lib/nbgrad/nbgrad-mpi"
fi

# the man page: formatted without warnings where groff is installed
man1=$P/share/man/man1/nbgrad.1
check "the man page is nbgrad(1) version $ver" grep -q "^\.TH NBGRAD 1 .*nbgrad $ver" "$man1"
if command -v groff > /dev/null 2>&1; then
    groff -man -Tutf8 -ww "$man1" > "$TMP/man.txt" 2> "$TMP/man.err"
    check "groff formats the man page without warnings" test ! -s "$TMP/man.err"
    check "the formatted man page has NAME, SYNOPSIS, OPTIONS and -cell" \
        sh -c "for w in NAME SYNOPSIS OPTIONS -cell -params; do
                   sed 's/.\x08//g' '$TMP/man.txt' | grep -q -e \"\$w\" || exit 1
               done"
else
    echo "SKIP install groff is not installed: the man page is not formatted"
    skip=$((skip + 1))
fi

# DESTDIR stages the same tree under another root, the files naming the final prefix; uninstall removes it all
S=$TMP/stage
if $MAKE_CMD --no-print-directory -s B="$B" install PREFIX=/opt/nbg DESTDIR="$S" > "$TMP/make.out" 2>&1; then
    check "DESTDIR: the staged nbgrad.pc says prefix=/opt/nbg" \
        grep -q -x 'prefix=/opt/nbg' "$S/opt/nbg/lib/pkgconfig/nbgrad.pc"
    check "DESTDIR: the staged tree is the prefix's" sh -c "cd '$S/opt/nbg' && find . | sort > '$TMP/s1' && cd '$P' && \
        find . | sort > '$TMP/s2' && cmp -s '$TMP/s1' '$TMP/s2'"
    $MAKE_CMD --no-print-directory -s B="$B" uninstall PREFIX=/opt/nbg DESTDIR="$S" > "$TMP/make.out" 2>&1
    check "make uninstall leaves no file" test -z "$(find "$S" \( -type f -o -type l \))"
else
    bad "make install PREFIX=/opt/nbg DESTDIR=\$TMP/stage failed"; sed 's/^/    /' "$TMP/make.out" | tail -n 20
fi
summary
