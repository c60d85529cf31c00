/* The BPF target's asm/posix_types.h: the generic one (see ../README). */
#include <asm-generic/posix_types.h>
