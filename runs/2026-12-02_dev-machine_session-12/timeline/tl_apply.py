import sys
root=sys.argv[1] if len(sys.argv)>1 else '.'
p=root+'/backends/ucc/ucc_dl.c'
s=open(p).read()
s=s.replace('#include <time.h>\n','''#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <x86intrin.h>
#define TLN 40000
static uint64_t tl_e[TLN], tl_p[TLN], tl_d[TLN];
static int tl_n, tl_on;
void gu_tl_start(void) { tl_n = 0; tl_on = 1; }
void gu_tl_dump(const char *path) {
	tl_on = 0;
	FILE *f = fopen(path, "w");
	for (int i = 0; i < tl_n && i < TLN; i++) fprintf(f, "%lu %lu %lu\\n", tl_e[i], tl_p[i], tl_d[i]);
	fclose(f);
}
static int tl_env = -1, tl_skip;
static void tl_envcheck(void) {
	if (tl_env == -1) { tl_env = getenv("GU_TL") != NULL; if (tl_env) tl_skip = 300000; }
	if (tl_env && tl_skip > 0 && --tl_skip == 0) { tl_on = 1; tl_n = 0; }
	if (tl_env && tl_n >= TLN) { char p[64]; snprintf(p, sizeof p, "/tmp/tlc-%d.txt", getpid()); gu_tl_dump(p); tl_env = 0; }
}
#define TL_E() do { tl_envcheck(); if (tl_on && tl_n < TLN) tl_e[tl_n] = __rdtsc(); } while (0)
#define TL_P() do { if (tl_on && tl_n < TLN) tl_p[tl_n] = __rdtsc(); } while (0)
#define TL_D() do { if (tl_on && tl_n < TLN) { tl_d[tl_n] = __rdtsc(); tl_n++; } } while (0)
''',1)
def rep(a,b):
    global s
    assert a in s, a
    s=s.replace(a,b)
rep('''	*at = -1;
	*posting = 0; // failures''','''	TL_E();
	*at = -1;
	*posting = 0; // failures''')
rep('''	if (ctx) {
		// First a test alone''','''	TL_P();
	if (ctx) {
		// First a test alone''')
rep('''		if (st < 0 && *err == 0) *err = st;
		p_ucc_collective_finalize((req_h)reqs[i]);''','''		TL_D();
		if (st < 0 && *err == 0) *err = st;
		p_ucc_collective_finalize((req_h)reqs[i]);''')
rep('''		req_h r = NULL;
		gu_status st = p_ucc_collective_init(&a, &r, (team_h)team);
		if (st != GU_OK) return st;
		if ((st = p_ucc_collective_post(r)) != GU_OK) return st;
		while''','''		req_h r = NULL;
		TL_E();
		gu_status st = p_ucc_collective_init(&a, &r, (team_h)team);
		if (st != GU_OK) return st;
		if ((st = p_ucc_collective_post(r)) != GU_OK) return st;
		TL_P();
		while''')
rep('''		gu_status fst = p_ucc_collective_finalize(r);''','''		TL_D();
		gu_status fst = p_ucc_collective_finalize(r);''')
open(p,'w').write(s)
p=root+'/backends/ucc/ucc_dl.h'
s=open(p).read()
s=s.replace('int gu_reap(uintptr_t *reqs, int n, int *err);','int gu_reap(uintptr_t *reqs, int n, int *err);\nvoid gu_tl_start(void);\nvoid gu_tl_dump(const char *path);')
open(p,'w').write(s)
p=root+'/backends/ucc/rawloop.go'
s=open(p).read()
s+='''
func TLStart() { C.gu_tl_start() }
func TLDump(path string) {
	cs := C.CString(path)
	C.gu_tl_dump(cs)
	C.free(unsafe.Pointer(cs))
}
'''
s=s.replace('#include "ucc_dl.h"','#include <stdlib.h>\n#include "ucc_dl.h"')
open(p,'w').write(s)
p=root+'/backends/ucc/tworanks_bench_test.go'
s=open(p).read()
s=s.replace('''	for range 3 {
		for _, s := range twoRanksSeries {''','''	if os.Getenv("TWO_TL") != "" {
		for _, s := range twoRanksSeries {
			TLStart()
			loops[s](30000)
			TLDump(fmt.Sprintf("/tmp/tl-%s-%d.txt", s, rank))
		}
	}
	for range 3 {
		for _, s := range twoRanksSeries {''')
open(p,'w').write(s)
