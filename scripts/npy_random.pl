#!/usr/bin/env perl
# npy_random.pl FILE SEED DIM... -- writes a float32 .npy of the given
# shape, uniform in [-1, 1) from SEED, for the ring demo (no numpy needed).
use strict;
use warnings;
use FindBin;
use lib $FindBin::Bin;
use Npy qw(npy_write);
my ($file, $seed, @shape) = @ARGV;
die "usage: $0 FILE SEED DIM...\n" unless defined $seed && @shape;
my $n = 1;
$n *= $_ for @shape;
srand($seed);
npy_write($file, "<f4", "f<*", \@shape, map { 2 * rand() - 1 } 1 .. $n);
