/* The BPF target's asm/swab.h: the generic one (see ../README). */
#include <asm-generic/swab.h>
