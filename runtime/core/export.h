// KILN_API: marks what libkiln exports. libkiln is built with -fvisibility=hidden and
// -fvisibility-inlines-hidden, so only declarations carrying KILN_API are in its dynamic symbol
// table; everything else is internal to the library (docs/ARCHITECTURE.md, "Public API and
// installed headers").
//
// Rule: every non-inline function declared in an installed header, and every class there with
// out-of-line members, a vtable or that is thrown, carries KILN_API (a class's KILN_API covers
// its members, vtable and typeinfo; inline members stay hidden copies in each binary). Free
// function templates instantiated inside the library carry it on the template declaration,
// and a type they are instantiated for needs it too (an instantiation is never more visible
// than its template arguments: from_vector<BFloat16>).
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif
