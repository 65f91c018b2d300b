#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <sched.h>
#include <stdlib.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(int c,char**v){int cpu=atoi(v[1]);int secs=atoi(v[2]);cpu_set_t s;CPU_ZERO(&s);CPU_SET(cpu,&s);sched_setaffinity(0,sizeof s,&s);
/* work units of a fixed dependent chain; time per 10 ms window of a fixed unit count */
volatile unsigned long x=1; int nw=secs*100; double *r=malloc(nw*sizeof(double));
for(int w=0;w<nw;w++){double t=now();for(long i=0;i<2000000;i++){x=x*6364136223846793005UL+1442695040888963407UL;}r[w]=now()-t;}
double mn=1e18;for(int w=0;w<nw;w++)if(r[w]<mn)mn=r[w];
int b[6]={0};for(int w=0;w<nw;w++){double q=r[w]/mn;int k=q<1.1?0:q<1.3?1:q<1.6?2:q<2.0?3:q<3?4:5;b[k]++;}
printf("cpu%d: min %.0f us/unit; ratio to min <1.1:%d 1.1-1.3:%d 1.3-1.6:%d 1.6-2:%d 2-3:%d >3:%d\n",cpu,mn,b[0],b[1],b[2],b[3],b[4],b[5]);
printf("cpu%d seq:",cpu);for(int w=0;w<nw&&w<300;w++)printf(" %.1f",r[w]/mn);printf("\n");}
