#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <sched.h>
#include <stdlib.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
volatile int stop=0;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
void* other(void*a){pin((int)(long)a);while(!stop)sched_yield();return 0;}
int main(int c,char**v){int cpu=atoi(v[1]);int n=atoi(v[2]);pthread_t t;pthread_create(&t,0,other,(void*)(long)cpu);pin(cpu);
/* n windows of 2000 yields each (each yield switches to the other thread and back): us per yield */
for(int w=0;w<n;w++){double t0=now();for(int i=0;i<2000;i++)sched_yield();printf("%.2f ",(now()-t0)/2000);}printf("\n");stop=1;pthread_join(t,0);}
