#include "textflag.h"

// func copyNTAVX2(dst, src *byte, n int)
// n a multiple of 64, dst 32-byte aligned: non-temporal stores, then SFENCE.
TEXT ·copyNTAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $6, CX
	JZ   done
loop:
	VMOVDQU  (SI), Y0
	VMOVDQU  32(SI), Y1
	VMOVNTDQ Y0, (DI)
	VMOVNTDQ Y1, 32(DI)
	ADDQ     $64, SI
	ADDQ     $64, DI
	DECQ     CX
	JNZ      loop
done:
	SFENCE
	VZEROUPPER
	RET
