#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
static double d(uint64_t b){double x;memcpy(&x,&b,8);return x;}
static uint64_t u(double x){uint64_t b;memcpy(&b,&x,8);return b;}
// libdevice __nv_exp, main path (|hi word as float| < 1082532651 as float i.e. |a| < ~708)
static double nv_exp(double a){
  double t1=fma(a,d(0x3FF71547652B82FEull),d(0x4338000000000000ull));
  int32_t i=(int32_t)(uint32_t)u(t1);
  double t4=t1+d(0xC338000000000000ull);
  double t5=fma(t4,d(0xBFE62E42FEFA39EFull),a);
  double r=fma(t4,d(0xBC7ABC9E3B39803Full),t5);
  double p=fma(d(0x3E5ADE1569CE2BDFull),r,d(0x3E928AF3FCA213EAull));
  p=fma(p,r,d(0x3EC71DEE62401315ull));
  p=fma(p,r,d(0x3EFA01997C89EB71ull));
  p=fma(p,r,d(0x3F2A01A014761F65ull));
  p=fma(p,r,d(0x3F56C16C1852B7AFull));
  p=fma(p,r,d(0x3F81111111122322ull));
  p=fma(p,r,d(0x3FA55555555502A1ull));
  p=fma(p,r,d(0x3FC5555555555511ull));
  p=fma(p,r,d(0x3FE000000000000Bull));
  p=fma(p,r,1.0);
  p=fma(p,r,1.0);
  uint64_t pb=u(p);
  uint32_t lo=(uint32_t)pb, hi=(uint32_t)(pb>>32);
  hi += (uint32_t)(i<<20);
  double z=d(((uint64_t)hi<<32)|lo);
  float ahi; uint32_t ah=(uint32_t)(u(a)>>32); memcpy(&ahi,&ah,4);
  float lim; uint32_t lb=1082532651u; memcpy(&lim,&lb,4);
  if (fabsf(ahi) < lim) return z;
  return NAN; // outside the main path: not compared
}
int main(){
  srand(7); long diff=0,n=0,skip=0,maxd=0,mind=0;
  for(long k=0;k<20000000;k++){
    // x = s - best: f32 scores differences, typical range [-40, 0]
    float s=( (float)rand()/RAND_MAX )*-40.0f;
    double x=(double)s;
    double a=nv_exp(x); if(isnan(a)){skip++;continue;}
    double b=exp(x); n++;
    if(u(a)!=u(b)){ diff++; long dd=(long)(u(a)-u(b)); if(dd>maxd)maxd=dd; if(dd<mind)mind=dd;}
  }
  printf("inputs %ld, differing %ld (%.3g), skipped %ld, ulp range [%ld,%ld]\n",n,diff,(double)diff/n,skip,mind,maxd);
  return 0;
}
