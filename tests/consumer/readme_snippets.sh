#!/usr/bin/env bash
# Compiles every C++ snippet of README.md against the headers in INC (-fsyntax-only), so what the
# README shows keeps compiling. Usage: readme_snippets.sh README INC WORKDIR
#
# A snippet is a ```cpp block. Lines of it that start with #include or `using namespace` go to the
# file's top; the rest becomes the body of a function. The names a fragment uses without
# declaring them come from an HTML comment on the line before its fence:
#   <!-- snippet: Tensor x = randn({3, 4}); -->        declarations at the top of the body
#   <!-- snippet-file: struct Net : ... { ... }; -->  declarations at file scope
set -euo pipefail
readme=$1 inc=$2 work=$3
mkdir -p "$work"
n=$(awk -v dir="$work" '
  /^<!-- snippet: .* -->$/      { body = substr($0, 15, length($0) - 18); next }
  /^<!-- snippet-file: .* -->$/ { file = substr($0, 20, length($0) - 23); next }
  /^```cpp/ { inblock = 1; n++; top = ""; code = ""; next }
  /^```/ && inblock {
    inblock = 0
    out = dir "/snippet_" n ".cpp"
    print "#include <kiln.h>\n#include <iostream>" top "\nusing namespace kiln;\n" file > out
    print "[[maybe_unused]] static void snippet_" n "() {\n" body "\n" code "}" >> out
    close(out); body = ""; file = ""; next
  }
  inblock && /^(#include|using namespace)/ { top = top "\n" $0; next }
  inblock { code = code $0 "\n"; next }
  { if ($0 !~ /^<!--/) { body = ""; file = "" } }
  END { print n }
' "$readme")
[ "$n" -gt 0 ] || { echo "readme_snippets: no C++ snippet in $readme" >&2; exit 1; }
failed=0
for f in "$work"/snippet_*.cpp; do
  if ! "${CXX:-c++}" -std=c++20 -fsyntax-only -I "$inc" -I /usr/include/xtensor "$f" 2>"$f.log"; then
    echo "readme_snippets: $(basename "$f") (README.md's C++ snippet) does not compile:" >&2
    cat "$f" >&2
    head -30 "$f.log" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] && echo "readme_snippets: $n README snippets compile"
exit "$failed"
