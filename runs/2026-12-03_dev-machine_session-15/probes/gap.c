#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <sched.h>
#include <stdlib.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(int c,char**v){int cpu=atoi(v[1]);double dur=atof(v[2]);cpu_set_t s;CPU_ZERO(&s);CPU_SET(cpu,&s);sched_setaffinity(0,sizeof s,&s);
double t0=now(),last=t0,tot=0;int n100=0,n1000=0;double mx=0;
while(1){double t=now();double g=t-last;if(g>100){n100++;tot+=g;if(g>1000)n1000++;if(g>mx)mx=g;}last=t;if(t-t0>dur*1e6)break;}
printf("cpu%d: gaps>100us %d (>1ms %d), total %.1f ms of %.0f s, max %.0f us\n",cpu,n100,n1000,tot/1e3,dur,mx);}
