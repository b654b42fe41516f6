#!/usr/bin/env perl
# npy_docs.pl FILE B S LEN -- writes an int32 .npy of shape (B, S): the
# document id t / LEN of each token t, for a document mask over packed
# sequences of LEN tokens each (no numpy needed).
use strict;
use warnings;
my ($file, $b, $s, $len) = @ARGV;
die "usage: $0 FILE B S LEN\n" unless defined $len && $len > 0;
my $header = "{'descr': '<i4', 'fortran_order': False, 'shape': ($b, $s), }";
# magic (6) + version (2) + length (2) + header + newline: a multiple of 64
my $pad = (64 - (10 + length($header) + 1) % 64) % 64;
$header .= " " x $pad . "\n";
open(my $fh, ">", $file) or die "$file: $!\n";
binmode $fh;
print $fh "\x93NUMPY\x01\x00", pack("v", length($header)), $header;
print $fh pack("l<*", map { int(($_ % $s) / $len) } 0 .. $b * $s - 1);
close $fh or die "$file: $!\n";
