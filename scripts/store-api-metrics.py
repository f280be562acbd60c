#!/usr/bin/env python3
"""Counts for issue 19: `impl Store` blocks, functions on Store (public, with a doc
example), files over 700 lines and the longest functions. Usage:
scripts/store-api-metrics.py REPO_ROOT"""
import os,re,sys
root=sys.argv[1]
src=os.path.join(root,'src')
impl_store=0; pub=0; allfn=0; doc_pub=0
files=[]
longest=[]
for dp,_,fs in os.walk(src):
    for f in fs:
        if not f.endswith('.rs'): continue
        p=os.path.join(dp,f); t=open(p).read(); lines=t.split('\n')
        files.append((len(lines),os.path.relpath(p,root)))
        # functions lengths (crude: fn line with '{' at end until matching indentation '}' )
        for i,l in enumerate(lines):
            m=re.match(r'^(\s*)(pub(\([a-z]+\))? )?fn (\w+)',l)
            if m:
                ind=m.group(1)
                for j in range(i+1,len(lines)):
                    if lines[j]==ind+'}':
                        longest.append((j-i+1,os.path.relpath(p,root),m.group(4))); break
        # impl Store blocks
        for m in re.finditer(r'^impl Store \{',t,re.M):
            impl_store+=1
            start=m.end(); end=t.find('\n}\n',start)
            block=t[start:end]
            bl=block.split('\n')
            for k,l in enumerate(bl):
                if re.match(r'^    (pub(\(crate\))? )?fn ',l):
                    allfn+=1
                    if l.startswith('    pub fn'):
                        pub+=1
                        # doc example?
                        d=k-1; has=False
                        while d>=0 and (bl[d].strip().startswith('///') or bl[d].strip().startswith('#[')):
                            if '```' in bl[d]: has=True
                            d-=1
                        if has: doc_pub+=1
files.sort(reverse=True); longest.sort(reverse=True)
print(f'impl Store blocks: {impl_store}; fns on Store: {allfn}; pub: {pub}; pub with a doc example: {doc_pub}')
print('files over 700 lines:', ', '.join(f'{p} {n}' for n,p in files if n>700))
print('longest functions:', ', '.join(f'{p}::{n} {k}' for k,p,n in longest[:6]))
