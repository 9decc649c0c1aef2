#!/usr/bin/env python3
"""Lists the length of every function defined in C++ sources.

usage: python3 tests/function_lengths.py [--max N] DIR_OR_FILE...

Prints `lines file:line name` per function, longest first, where `lines` counts from the first
line of the function's signature to its closing brace (inclusive). Functions are found by brace
matching on the source with comments, string and character literals and preprocessor lines
blanked out: a `{` at namespace, class or extern "C" scope whose head (the text since the last
`;`, `{` or `}`) reads as a signature opens a function body; bodies of classes, structs, unions
and namespaces are searched in turn; other braces (enums, initializers) are skipped. Functions
defined inside a function body (lambdas, local classes) count as part of it.
With --max N, prints only the functions longer than N lines and exits 1 when there is one.
"""
import os
import re
import sys

EXTS = (".cpp", ".cc", ".cxx", ".h", ".hpp", ".hh", ".hxx", ".inl")
LABEL = re.compile(r"\b(public|private|protected)\s*:(?!:)")
CONTROL = re.compile(r"^(if|for|while|switch|do|else|try|catch|return)\b")


def blank(src):
    """The source with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = list(src)
    i, n = 0, len(src)
    line_start = True

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if line_start and c == "#":
            j = i
            while j < n:  # the directive, with its backslash continuations
                if src[j] == "\n" and src[j - 1] != "\\":
                    break
                j += 1
            wipe(i, j)
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
        elif c == "R" and i + 1 < n and src[i + 1] == '"' and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', src[i:])
            if not m:
                i += 1
                continue
            close = ")" + m.group(1) + '"'
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            wipe(i + 1, j)
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and src[i - 1].isalnum() and i + 1 < n and src[i + 1].isalnum():
                i += 1  # digit separator (1'000)
                continue
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            wipe(i + 1, j - 1)
            i = j
        else:
            i += 1
    return "".join(out)


def match_brace(text, i):
    """Index of the `}` closing the `{` at i."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def signature_name(head):
    """The function's name in a signature (the identifier before its parameter list), or None."""
    head = head.strip()
    if not head or "(" not in head or CONTROL.match(head):
        return None
    m = re.search(r"((?:[A-Za-z_~][\w]*\s*(?:<[^()]*>)?\s*::\s*)*(?:operator\s*(?:\(\)|[^\s(]+)|~?[A-Za-z_]\w*))\s*\(", head)
    if not m:
        return None
    before = head[: m.start()]
    if "=" in before or "(" in before:
        return None  # a variable's initializer (a lambda), or no signature
    return re.sub(r"\s+", "", m.group(1))


SCOPE_HEAD = re.compile(r"^\s*(?:template\s*<.*?>\s*)?(?:inline\s+)?(namespace|class|struct|union)\b\s*(?:\[\[.*?\]\]\s*)?(?:[A-Z_]+_API\s+)?(\w*)", re.S)
ENUM_HEAD = re.compile(r"^\s*(?:typedef\s+)?enum\b")
EXTERN_C = re.compile(r'^\s*extern\s*"\s*"\s*$')


def functions(path):
    src = open(path, encoding="utf-8", errors="replace").read()
    text = blank(src)
    line_of = []
    ln = 1
    for ch in text:
        line_of.append(ln)
        if ch == "\n":
            ln += 1
    found = []
    scopes = []  # (index of the closing brace, class name or "") of the scopes we are in
    head_start = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if scopes and i == scopes[-1][0]:
            scopes.pop()
            head_start = i + 1
        elif c in ";}":
            head_start = i + 1
        elif c == "{":
            head = text[head_start:i]
            labels = list(LABEL.finditer(head))  # `public:` belongs to no head
            if labels:
                head_start += labels[-1].end()
                head = head[labels[-1].end():]
            end = match_brace(text, i)
            scope = SCOPE_HEAD.match(head)
            if scope and ("(" not in head or -1 < head.find(":") < head.find("(")) or EXTERN_C.match(head):
                name = scope.group(2) if scope and scope.group(1) != "namespace" else ""
                scopes.append((end, name))
                head_start = i + 1
                i += 1
                continue
            name = None if ENUM_HEAD.match(head) else signature_name(head)
            if name is not None:
                first = head_start + (len(head) - len(head.lstrip()))
                owner = "::".join(s for _, s in scopes if s)
                if owner and "::" not in name:
                    name = owner + "::" + name
                found.append((line_of[end] - line_of[first] + 1, line_of[first], name))
            i = end + 1
            head_start = i
            continue
        i += 1
    return found


def main(argv):
    limit = None
    if argv[:1] == ["--max"] and len(argv) > 1:
        limit, argv = int(argv[1]), argv[2:]
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    files = []
    for arg in argv:
        if os.path.isdir(arg):
            for root, _, names in os.walk(arg):
                files += [os.path.join(root, f) for f in names if f.endswith(EXTS)]
        else:
            files.append(arg)
    rows = []
    for f in sorted(files):
        rows += [(lines, f, line, name) for lines, line, name in functions(f)]
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    if limit is not None:
        rows = [r for r in rows if r[0] > limit]
    try:
        for lines, f, line, name in rows:
            print(f"{lines} {f}:{line} {name}")
    except BrokenPipeError:  # (piped into head)
        sys.stderr.close()
    return 1 if limit is not None and rows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
