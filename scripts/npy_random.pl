#!/usr/bin/env perl
# npy_random.pl FILE SEED DIM... -- writes a float32 .npy of the given
# shape, uniform in [-1, 1) from SEED, for the ring demo (no numpy needed).
use strict;
use warnings;
my ($file, $seed, @shape) = @ARGV;
die "usage: $0 FILE SEED DIM...\n" unless defined $seed && @shape;
my $n = 1;
$n *= $_ for @shape;
srand($seed);
my $dims = join(", ", @shape) . (@shape == 1 ? "," : "");
my $header = "{'descr': '<f4', 'fortran_order': False, 'shape': ($dims), }";
# magic (6) + version (2) + length (2) + header + newline: a multiple of 64
my $pad = (64 - (10 + length($header) + 1) % 64) % 64;
$header .= " " x $pad . "\n";
open(my $fh, ">", $file) or die "$file: $!\n";
binmode $fh;
print $fh "\x93NUMPY\x01\x00", pack("v", length($header)), $header;
print $fh pack("f<*", map { 2 * rand() - 1 } 1 .. $n);
close $fh or die "$file: $!\n";
