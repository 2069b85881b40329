/* Forced into every FFmpeg C file (-include): bind hypot to its oldest
 * version, so the extension keeps needing glibc <= 2.34 (manylinux_2_34).
 * On glibc >= 2.35 a plain call binds hypot@GLIBC_2.35, a new entry for the
 * same function. */
#include <features.h>
#if defined(__x86_64__) && defined(__GLIBC__)
__asm__(".symver hypot,hypot@GLIBC_2.2.5");
#endif
