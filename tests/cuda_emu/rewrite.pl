#!/usr/bin/perl
# A .cu file as C++ for the emulated GPU (tests/cuda_emu/kernel_emu.h): each launch
#   name<<<grid, block, shmem, stream>>>(args)   or   name<T><<<...>>>(args)
# becomes
#   (::emu::Launch(grid, block, shmem, stream) % [](auto... emu_a) { name(emu_a...); })(args)
# so the kernel is called as a function, once per emulated thread, with the launch's arguments.
# A #line directive keeps compiler messages pointing into the .cu file.
use strict;
use warnings;
my $path = $ARGV[0];
print "#line 1 \"$path\"\n";
while (my $line = <>) {
    $line =~ s/\b([A-Za-z_]\w*(?:<[\w:, ]*>)?)\s*<<<(.*?)>>>/(::emu::Launch($2) % [](auto... emu_a) { $1(emu_a...); })/g;
    die "$path:$.: a launch this script cannot rewrite (its <<< >>> spans lines)\n" if $line =~ /<<<|>>>/;
    print $line;
}
