#!/usr/bin/perl
# A .cu file as C++ for the emulated GPU (tests/cuda_emu/kernel_emu.h): each launch
#   name<<<grid, block, shmem, stream>>>(args)   or   name<T><<<...>>>(args)
# becomes
#   (::emu::Launch(grid, block, shmem, stream) % [](auto... emu_a) { name(emu_a...); })(args)
# so the kernel is called as a function, once per emulated thread, with the launch's arguments.
# Each `__shared__ T a[N], b[M];` or `__shared__ T c;` (on one line) is followed, on that line, by
#   ::emu::shared_memory(a, sizeof a); ::emu::shared_memory(b, sizeof b);  or  ...(&c, sizeof c);
# which gives each block of a launch NaN-filled shared memory.
# The project's own kernel headers (#include "....cuh") hold launches and shared memory too: they
# are rewritten into the output in place of their #include, each once.
# #line directives keep compiler messages pointing into the .cu and .cuh files.
use strict;
use warnings;
my %inlined;

sub rewrite {
    my ($path) = @_;
    open(my $in, '<', $path) or die "rewrite.pl: cannot read $path: $!\n";
    print "#line 1 \"$path\"\n";
    my $n = 0;  # this file's line ($. follows the last handle read, an included file's too)
    while (my $line = <$in>) {
        ++$n;
        if ($line =~ /^\s*#\s*include\s+"([^"]+\.cuh)"/) {
            rewrite($1) unless $inlined{$1}++;
            print "#line " . ($n + 1) . " \"$path\"\n";
            next;
        }
        if ($line =~ /^\s*#\s*pragma\s+once\b/) {  # an empty line in its place: #line stays true
            print "\n";
            next;
        }
        $line =~ s/\b([A-Za-z_]\w*(?:<[\w:, ]*>)?)\s*<<<(.*?)>>>/(::emu::Launch($2) % [](auto... emu_a) { $1(emu_a...); })/g;
        die "$path:$n: a launch this script cannot rewrite (its <<< >>> spans lines)\n" if $line =~ /<<<|>>>/;
        if ($line =~ /\b__shared__\b/) {
            $line =~ /^(\s*__shared__\s+[^;]*);\s*$/
                or die "$path:$n: a __shared__ declaration this script cannot follow (one per line, ending in ';')\n";
            (my $decls = $1) =~ s/^\s*__shared__\s+//;
            1 while $decls =~ s/<[^<>]*>//g;          # template arguments, whose commas separate no names
            1 while $decls =~ s/\[[^\[\]]*\]/\@/g;  # each bound to @, out of the way of the commas
            my @names = map {
                /(\w+)\s*\@/ ? $1 : /(\w+)\s*$/ ? "&$1" : die "$path:$n: a __shared__ declaration this script cannot name\n"
            } split /,/, $decls;
            chomp $line;
            $line .= join('', map { (my $n = $_) =~ s/^&//; " ::emu::shared_memory($_, sizeof $n);" } @names) . "\n";
        }
        print $line;
    }
    close($in);
}

rewrite($ARGV[0]);
