/* The BPF target's asm/types.h: the generic one (see ../README). */
#include <asm-generic/types.h>
