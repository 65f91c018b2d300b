#include <stdio.h>
#include <x86intrin.h>
#include <time.h>
int main(){struct timespec a,b;clock_gettime(CLOCK_MONOTONIC,&a);unsigned long t0=__rdtsc();struct timespec s={0,200000000};nanosleep(&s,0);unsigned long t1=__rdtsc();clock_gettime(CLOCK_MONOTONIC,&b);double ns=(b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec);printf("%.4f\n",(t1-t0)/ns);}
