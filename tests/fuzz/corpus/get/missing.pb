
papersno-such-document