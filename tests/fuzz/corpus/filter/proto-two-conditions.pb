

year

langen