// sim: n processes, flat allreduce of one counter via shared memory slots.
// policy 0: on miss, sched_yield. policy 1: spin while awaited peer's state is RUNNING (bounded), else yield.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>
#define N 8
struct slot { _Atomic long seq; _Atomic int state; char pad[64-12]; } __attribute__((aligned(64)));
struct board { struct slot s[N]; };
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void work(int ns){ if(!ns) return; struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); long e=t.tv_nsec+ns, s=t.tv_sec; for(;;){clock_gettime(CLOCK_MONOTONIC,&t); if(t.tv_sec>s|| t.tv_nsec>=e) break;} }
int main(int argc,char**argv){
  int n=atoi(argv[1]), pol=atoi(argv[2]), iters=atoi(argv[3]), w=atoi(argv[4]); const char*pin=argc>5?argv[5]:0;
  struct board*b=mmap(0,sizeof *b,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  for(int r=0;r<n;r++){ if(fork()==0){
    if(pin){cpu_set_t c;CPU_ZERO(&c);CPU_SET(pin[r]-'0',&c);sched_setaffinity(0,sizeof c,&c);}
    long yields=0, spins=0;
    double t0=0;
    for(long k=1;k<=iters;k++){
      if(k==iters/10) t0=now();
      work(w);
      atomic_store(&b->s[r].seq,k);
      for(int q=0;q<n;q++){ if(q==r) continue;
        int spun=0, ann=0;
        while(atomic_load(&b->s[q].seq)<k){
          if(pol==1 && atomic_load(&b->s[q].state)==0 && spun<20000){ spun++; spins++; continue;}
          if(!ann){atomic_store(&b->s[r].state,1);ann=1;} sched_yield(); yields++;
        }
        if(ann) atomic_store(&b->s[r].state,0);
      }
    }
    double t=now()-t0;
    if(r==0) printf("n=%d pol=%d work=%dns: %.3f us/op, yields/op %.2f spins/op %.1f\n",n,pol,w,t*1e6/(iters-iters/10),(double)yields/iters,(double)spins/iters);
    fflush(stdout); _exit(0);} }
  for(int r=0;r<n;r++) wait(0);
}
