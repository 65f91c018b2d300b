#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <sched.h>
#include <stdlib.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
volatile long flag __attribute__((aligned(64)));
int N;
void* other(void*a){pin(1);for(long i=1;;i+=2){while(flag!=i){if(flag<0)return 0;}flag=i+1;}}
int main(int c,char**v){N=atoi(v[1]);pthread_t t;flag=0;pthread_create(&t,0,other,0);pin(0);
long k=0;for(int w=0;w<N;w++){double t0=now();for(int i=0;i<10000;i++){flag=k+1;while(flag!=k+2);k+=2;}printf("%.3f ",(now()-t0)/10000);}printf("\n");flag=-1;pthread_join(t,0);}
