// What a direct AMX convolution could reach: ResNet-50's 3x3 conv, 56x56x64 -> 64, pad 1,
// bf16 -> f32, one thread, written by hand. The input is padded once per call (58x58x64),
// then read in place: a tile of 14 rows is 14 consecutive output pixels of one image row
// (14 divides the 56-wide row, so no tile crosses a row), its rows 64 channels apart; the
// weights are pre-packed per tap into the VNNI layout; 2x2 accumulator tiles (28 pixels x
// 32 channels) stay in tiles across the 9 taps and 2 channel steps.
//
// tessel cannot express this yet: its AMX tiles always have 16 rows, and 16 does not divide
// 56, so its convolutions copy the input per block (an im2col of the window). This harness
// is the evidence for tiles of fewer rows (the tile configuration allows 1-16).
//
//   gcc -O2 -march=native bench/amx/direct_conv.c -o /tmp/direct_conv -lm
//   taskset -c 1 /tmp/direct_conv
//   bench/peers/.venv/onednn_bench conv bf16 1 56 56 64 64 3 3 1 1 nhwc 0.5   # the peer
//
// Measured 2026-12-05 on an Emerald Rapids guest (fixtures/bench/spr-amx-2026-12-05.txt),
// core 0 idle, minutes apart in one of the guest's slow phases: 0.23-0.25 ms median (912-1006
// GFLOP/s) against oneDNN's brgconv 0.29 ms (800); the tile loop alone 0.115 ms (2000).
// Pitfall: zeroing the padded buffer with one memset made every call 0.54 ms. glibc's memset
// of 430 KB runs `rep stosb` here (x86_rep_stosb_threshold 2 KiB), and the tile loads that
// followed ran several times slower; 128-byte memsets do not. With the other vCPU running
// a dataset's AMX kernels this harness fell to 0.52-0.54 ms while oneDNN held 0.245 ms:
// something here (the padding pass, most likely) is sensitive to the sibling, and oneDNN's
// kernel is not. Not yet understood.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <unistd.h>
#include <sys/syscall.h>
#define H 56
#define W 56
#define C 64
#define K 64
#define R 14
typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static cfg_t cfg __attribute__((aligned(64)));
static uint16_t Ip[(H+2)*(W+2)*C] __attribute__((aligned(64)));
static uint16_t Wp[3*3*2*4*16*32] __attribute__((aligned(64)));
static float Cout[H*W*K] __attribute__((aligned(64)));
static uint16_t I[H*W*C], Wt[K*3*3*C];
static float tobf(uint16_t h){ uint32_t u=(uint32_t)h<<16; float f; memcpy(&f,&u,4); return f; }
static void kernel(void){
  // pad once
  if (getenv("NOPAD")==0) { memset(Ip,0,sizeof Ip);
  for(int p=0;p<H;p++) memcpy(&Ip[((p+1)*(W+2)+1)*C], &I[p*W*C], W*C*2); }
  _tile_loadconfig(&cfg);
  for(int p=0;p<H;p++) for(int q0=0;q0<W;q0+=2*R) for(int nb=0;nb<4;nb+=2){
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for(int r=0;r<3;r++) for(int s=0;s<3;s++) for(int ks=0;ks<2;ks++){
      const uint16_t *a0=&Ip[((p+r)*(W+2)+q0+s)*C+ks*32];
      const uint16_t *b=&Wp[(((r*3+s)*2+ks)*4+nb)*512];
      _tile_loadd(4,a0,C*2); _tile_loadd(6,b,64);
      _tile_dpbf16ps(0,4,6);
      _tile_loadd(7,b+512,64);
      _tile_dpbf16ps(1,4,7);
      _tile_loadd(5,a0+R*C,C*2);
      _tile_dpbf16ps(2,5,6);
      _tile_dpbf16ps(3,5,7);
    }
    float *c=&Cout[(p*W+q0)*K+nb*16];
    _tile_stored(0,c,K*4); _tile_stored(1,c+16,K*4); _tile_stored(2,c+R*K,K*4); _tile_stored(3,c+R*K+16,K*4);
  }
  _tile_release();
}
static double now(void){ struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9; }
int main(){
  syscall(SYS_arch_prctl, 0x1023, 18);
  cfg.palette=1;
  for(int t=0;t<4;t++){cfg.rows[t]=R;cfg.colsb[t]=64;}
  for(int t=4;t<6;t++){cfg.rows[t]=R;cfg.colsb[t]=64;}
  for(int t=6;t<8;t++){cfg.rows[t]=16;cfg.colsb[t]=64;}
  srand(1);
  for(int i=0;i<H*W*C;i++) I[i]=0x3f80+(rand()%64)-32;
  for(int i=0;i<K*9*C;i++) Wt[i]=0x3f80+(rand()%64)-32;
  // pack W[k][r][s][c] -> Wp[r][s][ks][nt][c2(16)][n(16)][2]
  for(int k=0;k<K;k++) for(int r=0;r<3;r++) for(int s=0;s<3;s++) for(int c=0;c<C;c++){
    int ks=c/32, cc=c%32, nt=k/16, n=k%16;
    Wp[(((r*3+s)*2+ks)*4+nt)*512 + (cc/2)*32 + n*2 + cc%2] = Wt[((k*3+r)*3+s)*C+c];
  }
  kernel();
  // check some outputs
  double maxerr=0;
  for(int t=0;t<2000;t++){ int p=rand()%H,q=rand()%W,k=rand()%K; double ref=0;
    for(int r=0;r<3;r++)for(int s=0;s<3;s++){int y=p+r-1,x=q+s-1; if(y<0||y>=H||x<0||x>=W)continue;
      for(int c=0;c<C;c++) ref+=tobf(I[(y*W+x)*C+c])*tobf(Wt[((k*3+r)*3+s)*C+c]);}
    double e=fabs(ref-Cout[(p*W+q)*K+k])/(fabs(ref)+1e-3); if(e>maxerr)maxerr=e; }
  printf("max rel err %.2e\n",maxerr);
  double best=1e9, ts[200]; int n=0; double t0=now();
  while(now()-t0<0.5 && n<200){ double a=now(); kernel(); ts[n++]=now()-a; }
  for(int i=0;i<n;i++) if(ts[i]<best) best=ts[i];
  // median
  for(int i=0;i<n;i++)for(int j=i+1;j<n;j++) if(ts[j]<ts[i]){double x=ts[i];ts[i]=ts[j];ts[j]=x;}
  double flop=2.0*H*W*K*C*9;
  printf("runs %d median %.4f ms (%.1f GFLOP/s) min %.4f ms (%.1f)\n",n,ts[n/2]*1e3,flop/ts[n/2]*1e-9,best*1e3,flop/best*1e-9);
}
