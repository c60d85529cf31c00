/* The BPF target's asm/bitsperlong.h: the generic one (see ../README). */
#include <asm-generic/bitsperlong.h>
