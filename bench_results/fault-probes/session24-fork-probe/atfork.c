#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <pthread.h>
static void who(const char *what, void *f) {
  Dl_info i; if (f && dladdr(f, &i)) fprintf(stderr, "[atfork] %s %s %s\n", what, i.dli_fname, i.dli_sname ? i.dli_sname : "?");
  else if (f) fprintf(stderr, "[atfork] %s %p\n", what, f);
}
int __register_atfork(void (*p)(void), void (*pa)(void), void (*c)(void), void *d) {
  static int (*real)(void (*)(void), void (*)(void), void (*)(void), void*);
  if (!real) real = dlsym(RTLD_NEXT, "__register_atfork");
  who("prepare", (void*)p); who("parent", (void*)pa); who("child", (void*)c);
  return real(p, pa, c, d);
}
