# judge.awk: per line of sweeps.sh, the goals missed (np 2 unless NP=4)
{ miss=""; for (i=2;i<=NF;i++){ split($i,a,":"); split(a[2],b,"/"); s=a[1]+0; o=b[1]+0; x=b[3]+0;
   if (NP==4) { if (x<0.8) miss=miss" "s"B x"x }
   else if (s==8 && o>2) miss=miss" 8B "o; else if (s==4096 && o>5) miss=miss" 4K "o; else if (s>=65536 && x<1.0) miss=miss" "s"B x"x }
  if (miss=="") pass++; else print NR": miss"miss; n++ }
END { print pass" of "n" sweeps meet every goal" }
